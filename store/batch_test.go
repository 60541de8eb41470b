package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/store"
)

func TestClaimBatch(t *testing.T) {
	t.Parallel()
	st := migrated(t, 2)
	ctx := context.Background()
	batch := func(keys ...string) []string {
		var got []string
		require.NoError(t, pgx.BeginFunc(ctx, st.Pool(), func(tx pgx.Tx) error {
			var err error
			got, err = st.ClaimBatch(ctx, tx, "c", keys)
			return err
		}))
		return got
	}
	require.Equal(t, []string{"a", "b", "c"}, batch("c", "a", "b", "a"), "new keys, sorted, in-batch duplicates once")
	require.Equal(t, []string{"d"}, batch("b", "d", "a"), "only the new key")
	require.Empty(t, batch("a", "d"))
	_, err := st.ClaimBatch(ctx, nil, "c", []string{"x"})
	require.Error(t, err)
}

func TestClaimsByEventDay(t *testing.T) {
	t.Parallel()
	st := migrated(t, 2)
	ctx := context.Background()
	byDay, err := st.ClaimsByEventDay(ctx)
	require.NoError(t, err)
	require.False(t, byDay)
	_, err = st.EnablePartitioning(ctx, store.PartitionConfig{})
	require.NoError(t, err)
	byDay, err = st.ClaimsByEventDay(ctx)
	require.NoError(t, err)
	require.True(t, byDay)

	claim := func(r store.ClaimRequest) store.ClaimResult { return claimWith(t, st, r) }
	// An hour into yesterday (UTC), so a minute later is the same event day.
	at := store.EventDay(time.Now().Add(-24 * time.Hour)).Add(time.Hour)
	h1, h2 := []byte{1}, []byte{2}
	require.True(t, claim(store.ClaimRequest{Consumer: "c", Key: "k", EventTime: at, PayloadHash: h1}).New)
	require.Equal(t, store.ClaimResult{FingerprintMismatch: true}, claim(store.ClaimRequest{Consumer: "c", Key: "k", EventTime: at, PayloadHash: h2, Wait: time.Second}))
	require.Equal(t, store.ClaimResult{}, claim(store.ClaimRequest{Consumer: "c", Key: "k", EventTime: at.Add(time.Minute)}))
}
