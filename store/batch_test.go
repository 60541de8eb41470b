package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/internal/pg"
	"github.com/claimtx/claimtx/store"
)

func TestClaimBatch(t *testing.T) {
	t.Parallel()
	st := migrated(t, 2)
	ctx := context.Background()
	batch := func(keys ...string) []string {
		tx, got, err := st.BeginClaimBatchForTest(ctx, pgx.TxOptions{}, "c", keys, 0)
		require.NoError(t, err)
		require.NoError(t, tx.Commit(ctx))
		return got
	}
	require.Equal(t, []string{"a", "b", "c"}, batch("c", "a", "b", "a"), "new keys, sorted, in-batch duplicates once")
	require.Equal(t, []string{"d"}, batch("b", "d", "a"), "only the new key")
	require.Empty(t, batch("a", "d"))
}

// BeginClaimBatch: the claims in a transaction it begins in the same
// round trip with the given options; a claim that
// fails (behind an uncommitted twin, past its wait) leaves no transaction
// and gives the connection back.
func TestBeginClaimBatch(t *testing.T) {
	t.Parallel()
	st := migrated(t, 2)
	ctx := context.Background()
	tx, got, err := st.BeginClaimBatchForTest(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead}, "c", []string{"b", "a", "b"}, time.Second)
	require.NoError(t, err)
	require.Equal(t, []string{"a", "b"}, got)
	var iso, lockTimeout string
	require.NoError(t, tx.QueryRow(ctx, "SELECT current_setting('transaction_isolation'), current_setting('lock_timeout')").Scan(&iso, &lockTimeout))
	require.Equal(t, "repeatable read", iso)
	require.Equal(t, "0", lockTimeout, "the effects must not inherit the claim's lock_timeout")

	// Behind the uncommitted claim of "a": the wait expires.
	_, _, err = st.BeginClaimBatchForTest(ctx, pgx.TxOptions{}, "c", []string{"a", "c"}, 20*time.Millisecond)
	require.Equal(t, pg.ClaimWait, pg.Classify(err))
	require.Equal(t, int32(1), st.Pool().Stat().AcquiredConns(), "only the first transaction's connection is out")
	require.NoError(t, tx.Commit(ctx))

	tx, got, err = st.BeginClaimBatchForTest(ctx, pgx.TxOptions{}, "c", []string{"a", "c"}, time.Second)
	require.NoError(t, err)
	require.Equal(t, []string{"c"}, got, "a is a duplicate now")
	require.NoError(t, tx.Rollback(ctx))
}

func TestClaimsByEventDay(t *testing.T) {
	t.Parallel()
	st := migrated(t, 2)
	ctx := context.Background()
	byDay, err := st.ClaimsByEventDay(ctx)
	require.NoError(t, err)
	require.False(t, byDay)
	_, err = st.EnablePartitioning(ctx, store.RetentionConfig{})
	require.NoError(t, err)
	byDay, err = st.ClaimsByEventDay(ctx)
	require.NoError(t, err)
	require.True(t, byDay)

	claim := func(r store.ClaimRequest) store.ClaimResult { return claimWith(t, st, r) }
	// An hour into yesterday (UTC), so a minute later is the same event day.
	at := pg.EventDay(time.Now().Add(-24 * time.Hour)).Add(time.Hour)
	h1, h2 := []byte{1}, []byte{2}
	require.True(t, claim(store.ClaimRequest{Consumer: "c", Key: "k", EventTime: at, PayloadHash: h1}).New)
	require.Equal(t, store.ClaimResult{FingerprintMismatch: true}, claim(store.ClaimRequest{Consumer: "c", Key: "k", EventTime: at, PayloadHash: h2, MaxClaimWait: time.Second}))
	require.Equal(t, store.ClaimResult{}, claim(store.ClaimRequest{Consumer: "c", Key: "k", EventTime: at.Add(time.Minute)}))
}
