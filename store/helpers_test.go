package store_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/internal/testenv"
	"github.com/claimtx/claimtx/store"
)

// childStore is the store of a test that runs only as a child process of
// the test parent, which names its database in the environment variable
// urlEnv; run any other way, the test is skipped.
func childStore(t *testing.T, urlEnv, parent string, cfg store.Config) *store.Store {
	t.Helper()
	dbURL := os.Getenv(urlEnv)
	if dbURL == "" {
		t.Skip("only run as a child process of " + parent)
	}
	pool, err := pgxpool.New(context.Background(), dbURL)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	st, err := store.New(pool, cfg)
	require.NoError(t, err)
	return st
}

// begin opens a transaction on st's pool, rolled back when the test ends
// unless it ended before.
func begin(t *testing.T, st *store.Store) pgx.Tx {
	t.Helper()
	return testenv.Begin(t, st.Pool())
}

// claimWith makes the claim r in a transaction of its own and commits it.
func claimWith(t *testing.T, st *store.Store, r store.ClaimRequest) store.ClaimResult {
	t.Helper()
	ctx := context.Background()
	var res store.ClaimResult
	require.NoError(t, pgx.BeginFunc(ctx, st.Pool(), func(tx pgx.Tx) error {
		var err error
		res, err = st.Claim(ctx, tx, r)
		return err
	}))
	return res
}

// claimKey claims (consumer, key) in tx with Store.Claim, its wait bounded
// by wait, and reports whether the claim was new.
func claimKey(ctx context.Context, st *store.Store, tx pgx.Tx, consumer, key string, wait time.Duration) (bool, error) {
	res, err := st.Claim(ctx, tx, store.ClaimRequest{Consumer: consumer, Key: key, MaxClaimWait: wait})
	return res.New, err
}

// claimKeyAt is claimKey with the event time at (partitioned mode).
func claimKeyAt(ctx context.Context, st *store.Store, tx pgx.Tx, consumer, key string, at time.Time, wait time.Duration) (bool, error) {
	res, err := st.Claim(ctx, tx, store.ClaimRequest{Consumer: consumer, Key: key, EventTime: at, MaxClaimWait: wait})
	return res.New, err
}

// requireVersion checks the schema version st reports.
func requireVersion(t *testing.T, st *store.Store, want int) {
	t.Helper()
	v, err := st.Version(context.Background())
	require.NoError(t, err)
	require.Equal(t, want, v)
}

// fixedBatches makes Cleanup use exactly n rows per batch and no pause, so
// tests can reason about batch counts.
func fixedBatches(n int) store.RetentionConfig {
	return store.RetentionConfig{BatchSize: n, MinBatchSize: n, MaxBatchSize: n, Pause: -1}
}

func claimsTable(st *store.Store) string {
	return pgx.Identifier{st.Config().Schema, st.Config().ClaimsTable}.Sanitize()
}

func memoTable(st *store.Store) string {
	return pgx.Identifier{st.Config().Schema, st.Config().ClaimsTable + "_poison_memo"}.Sanitize()
}

// insertSeries inserts n rows for consumer keyed prefix1 … prefixn into
// table; vals, the SQL for the further columns cols, may use $3, the
// offset (an SQL interval such as '-30 days -1 second').
func insertSeries(t *testing.T, st *store.Store, table, cols, vals, consumer, prefix string, n int, offset string) {
	t.Helper()
	_, err := st.Pool().Exec(context.Background(), fmt.Sprintf(
		`INSERT INTO %s (consumer, message_key, %s)
		 SELECT $1, $2 || g, %s FROM generate_series(1, $4) g`, table, cols, vals), consumer, prefix, offset, n)
	require.NoError(t, err)
}

// insertAged inserts n claims for consumer processed at now() + offset.
func insertAged(t *testing.T, st *store.Store, consumer, prefix string, n int, offset string) {
	t.Helper()
	insertSeries(t, st, claimsTable(st), "processed_at", "now() + $3::interval", consumer, prefix, n, offset)
}

// aged is n claims for consumer, keyed prefix0 on, processed at now() +
// offset.
type aged struct {
	consumer, prefix string
	n                int
	offset           string
}

// migratedWith is a migrated store of conns connections holding the claims
// of sets: the retention tests each start from their own mix of old and
// new claims.
func migratedWith(t *testing.T, conns int32, sets ...aged) *store.Store {
	t.Helper()
	st := testenv.Migrated(t, conns)
	for _, a := range sets {
		insertAged(t, st, a.consumer, a.prefix, a.n, a.offset)
	}
	return st
}

// insertMemos inserts n poison memos for consumer last poisoned at now() +
// offset.
func insertMemos(t *testing.T, st *store.Store, consumer, prefix string, n int, offset string) {
	t.Helper()
	insertSeries(t, st, memoTable(st), "reason, poisoned_at", "'bad order', now() + $3::interval", consumer, prefix, n, offset)
}

// countIn counts the rows of table (a sanitized name) that match where.
func countIn(t *testing.T, st *store.Store, table, where string, args ...any) int64 {
	t.Helper()
	return testenv.Scalar(t, st.Pool(), "SELECT count(*) FROM "+table+" WHERE "+where, args...)
}

func countWhere(t *testing.T, st *store.Store, where string, args ...any) int64 {
	t.Helper()
	return countIn(t, st, claimsTable(st), where, args...)
}

func memoCount(t *testing.T, st *store.Store) int64 {
	t.Helper()
	return countIn(t, st, memoTable(st), "true")
}
