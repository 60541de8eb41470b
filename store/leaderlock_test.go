package store_test

import (
	"context"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/internal/testenv"
	"github.com/claimtx/claimtx/store"
)

// Every retention operation on a table shares one leader lock: while one
// holds it (here, another instance mid-run), all the others report
// store.ErrNotLeader at once instead of waiting or running alongside.
func TestRetentionOperationsShareTheLeaderLock(t *testing.T) {
	t.Parallel()
	pool, schema := testenv.Setup(t, 4)
	st, err := store.New(pool, store.Config{Schema: schema})
	require.NoError(t, err)
	ctx := context.Background()
	require.NoError(t, st.Migrate(ctx))

	unlock, err := st.LockRetentionForTest(ctx)
	require.NoError(t, err)
	release := sync.OnceFunc(unlock)
	t.Cleanup(release) // a failed assertion must not leave the conn out of the pool
	_, err = st.Cleanup(ctx, store.RetentionConfig{})
	require.ErrorIs(t, err, store.ErrNotLeader)
	require.ErrorIs(t, st.PreparePartitioning(ctx, store.RetentionConfig{}), store.ErrNotLeader)
	_, err = st.EnablePartitioning(ctx, store.RetentionConfig{})
	require.ErrorIs(t, err, store.ErrNotLeader)
	_, err = st.CreatePartitionsAhead(ctx, store.RetentionConfig{})
	require.ErrorIs(t, err, store.ErrNotLeader)
	_, err = st.DropExpiredPartitions(ctx, store.RetentionConfig{})
	require.ErrorIs(t, err, store.ErrNotLeader)
	_, err = st.Cleanup(ctx, store.RetentionConfig{DryRun: true})
	require.NoError(t, err, "a dry run deletes nothing and needs no lock")

	// A store on another table is not affected.
	otherSchema := testenv.NewSchema(t)
	other, err := store.New(pool, store.Config{Schema: otherSchema})
	require.NoError(t, err)
	require.NoError(t, other.Migrate(ctx))
	_, err = other.Cleanup(ctx, store.RetentionConfig{Pause: -1})
	require.NoError(t, err)

	release()
	_, err = st.EnablePartitioning(ctx, store.RetentionConfig{})
	require.NoError(t, err)
}
