package store

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/internal/testenv"
)

// Every retention operation on a table shares one leader lock: while one
// holds it (here, another instance mid-run), all the others report
// ErrNotLeader at once instead of waiting or running alongside.
func TestRetentionOperationsShareTheLeaderLock(t *testing.T) {
	t.Parallel()
	pool, schema := testenv.Setup(t, 4)
	st, err := New(pool, Config{Schema: schema})
	require.NoError(t, err)
	ctx := context.Background()
	require.NoError(t, st.Migrate(ctx))

	_, unlock, err := st.lockRetention(ctx)
	require.NoError(t, err)
	release := sync.OnceFunc(unlock)
	t.Cleanup(release) // a failed assertion must not leave the conn out of the pool
	_, err = st.Cleanup(ctx, RetentionConfig{})
	require.ErrorIs(t, err, ErrNotLeader)
	require.ErrorIs(t, st.PreparePartitioning(ctx, RetentionConfig{}), ErrNotLeader)
	_, err = st.EnablePartitioning(ctx, RetentionConfig{})
	require.ErrorIs(t, err, ErrNotLeader)
	_, err = st.CreatePartitionsAhead(ctx, RetentionConfig{})
	require.ErrorIs(t, err, ErrNotLeader)
	_, err = st.DropExpiredPartitions(ctx, RetentionConfig{})
	require.ErrorIs(t, err, ErrNotLeader)
	_, err = st.Cleanup(ctx, RetentionConfig{DryRun: true})
	require.NoError(t, err, "a dry run deletes nothing and needs no lock")

	// A store on another table is not affected.
	otherSchema := testenv.NewSchema(t)
	other, err := New(pool, Config{Schema: otherSchema})
	require.NoError(t, err)
	require.NoError(t, other.Migrate(ctx))
	_, err = other.Cleanup(ctx, RetentionConfig{Pause: -1})
	require.NoError(t, err)

	release()
	_, err = st.EnablePartitioning(ctx, RetentionConfig{})
	require.NoError(t, err)
}

func TestNextBatchSize(t *testing.T) {
	t.Parallel()
	ms := time.Millisecond
	cfg := RetentionConfig{MinBatchSize: 100, MaxBatchSize: 10000, TargetBatchDuration: 200 * ms}.withDefaults()
	require.Equal(t, 1250, nextBatchSize(1000, 160*ms, cfg), "scaled toward the target")
	require.Equal(t, 2000, nextBatchSize(1000, 50*ms, cfg), "at most doubles")
	require.Equal(t, 2000, nextBatchSize(1000, 0, cfg), "a zero duration counts as 1ms")
	require.Equal(t, 500, nextBatchSize(1000, time.Hour, cfg), "at most halves")
	require.Equal(t, 10000, nextBatchSize(8000, ms, cfg), "capped")
	require.Equal(t, 100, nextBatchSize(150, time.Hour, cfg), "floored")
}
