package store_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/internal/pg"
	"github.com/claimtx/claimtx/internal/testenv"
	"github.com/claimtx/claimtx/store"
	"github.com/claimtx/claimtx/store/internal/migrate"
)

func TestMigrateConcurrentAndIdempotent(t *testing.T) {
	t.Parallel()
	st := testenv.Store(t, 8)
	schema := st.Config().Schema
	ctx := context.Background()
	requireVersion(t, st, 0)

	// Eight instances starting at once against the same schema.
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- st.Migrate(ctx)
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.NoError(t, st.Migrate(ctx))
	requireVersion(t, st, migrate.Latest())

	var n int
	require.NoError(t, st.Pool().QueryRow(ctx, fmt.Sprintf("SELECT count(*) FROM %s.claimtx_migration", pgx.Identifier{schema}.Sanitize())).Scan(&n))
	require.Equal(t, migrate.Latest(), n, "one row per migration: versions run 1..Latest without gaps")

	// The seed's table shape and the processed_at index.
	var cols []string
	rows, err := st.Pool().Query(ctx, `SELECT column_name || ' ' || data_type || ' ' || is_nullable FROM information_schema.columns
		WHERE table_schema = $1 AND table_name = 'processed_messages' ORDER BY ordinal_position`, schema)
	require.NoError(t, err)
	cols, err = pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	// The seed's three columns, plus the optional payload fingerprint
	// (migration 003), NULL unless Claim.Fingerprint is on, and the
	// writing transaction (migration 005), NULL for older rows.
	require.Equal(t, []string{"consumer text NO", "message_key text NO", "processed_at timestamp with time zone NO", "payload_hash bytea YES", "xact xid8 YES"}, cols)
	var idx int
	// Catalog joins rather than pg_indexes: that view renders every
	// index's definition, and other tests drop tables concurrently
	// ("could not open relation with OID").
	require.NoError(t, st.Pool().QueryRow(ctx, `SELECT count(*) FROM pg_index x
		JOIN pg_class t ON t.oid = x.indrelid
		JOIN pg_namespace n ON n.oid = t.relnamespace
		JOIN pg_attribute a ON a.attrelid = t.oid AND a.attnum = x.indkey[0]
		WHERE n.nspname = $1 AND t.relname = 'processed_messages' AND x.indnatts = 1 AND a.attname = 'processed_at'`, schema).Scan(&idx))
	require.Equal(t, 1, idx)

	require.NoError(t, st.MigrateDownForTest(ctx, 0))
	requireVersion(t, st, 0)
	require.Error(t, st.MigrateDownForTest(ctx, -1))
	require.NoError(t, st.Migrate(ctx))
}

func TestMigrateTxRollsBackWithCaller(t *testing.T) {
	t.Parallel()
	st := testenv.Store(t, 2)
	ctx := context.Background()
	tx := begin(t, st)
	require.NoError(t, st.MigrateTx(ctx, tx))
	require.NoError(t, tx.Rollback(ctx))
	requireVersion(t, st, 0)
}

func TestClaim(t *testing.T) {
	t.Parallel()
	st := testenv.Migrated(t, 4)
	ctx := context.Background()

	claimIn := func(key string, commit bool) bool {
		tx := begin(t, st)
		ok, err := claimKey(ctx, st, tx, "c", key, 0)
		require.NoError(t, err)
		if commit {
			require.NoError(t, tx.Commit(ctx))
		} else {
			require.NoError(t, tx.Rollback(ctx))
		}
		return ok
	}
	require.True(t, claimIn("k1", false))
	require.True(t, claimIn("k1", true), "a rolled-back claim leaves nothing behind")
	require.False(t, claimIn("k1", true))
	require.True(t, claimIn("k2", true))

	_, err := claimKey(ctx, st, nil, "c", "k", 0)
	require.Error(t, err)
}

func TestClaimWaitRestoresLockTimeout(t *testing.T) {
	t.Parallel()
	st := testenv.Migrated(t, 4)
	ctx := context.Background()
	tx := begin(t, st)
	var before, after string
	require.NoError(t, tx.QueryRow(ctx, "SHOW lock_timeout").Scan(&before))
	ok, err := claimKey(ctx, st, tx, "c", "k", 250*time.Millisecond)
	require.NoError(t, err)
	require.True(t, ok)
	require.NoError(t, tx.QueryRow(ctx, "SHOW lock_timeout").Scan(&after))
	require.Equal(t, before, after, "the handler must not inherit the claim's lock_timeout")
}

func TestClaimWaitTimesOutBehindTwin(t *testing.T) {
	t.Parallel()
	st := testenv.Migrated(t, 4)
	ctx := context.Background()
	holder := begin(t, st)
	ok, err := claimKey(ctx, st, holder, "c", "k", 0)
	require.NoError(t, err)
	require.True(t, ok)

	tx := begin(t, st)
	start := time.Now()
	_, err = claimKey(ctx, st, tx, "c", "k", 50*time.Millisecond)
	require.Error(t, err)
	require.GreaterOrEqual(t, time.Since(start), 50*time.Millisecond)
	require.Equal(t, pg.ClaimWait, pg.Classify(err))
	require.True(t, store.IsTransient(err))
}

func TestHostileNamesRejected(t *testing.T) {
	t.Parallel()
	pool, _ := testenv.Setup(t, 1)
	for _, tc := range []struct {
		field string
		cfg   store.Config
	}{
		{"Schema", store.Config{Schema: `x"; DROP TABLE users; --`}},
		{"Schema", store.Config{Schema: "Upper"}},
		{"Schema", store.Config{Schema: "1abc"}},
		{"Schema", store.Config{Schema: "pg_catalog"}},
		{"Schema", store.Config{Schema: "pg_claims"}},
		{"Schema", store.Config{Schema: "information_schema"}},
		{"ClaimsTable", store.Config{ClaimsTable: "t; drop"}},
		{"ClaimsTable", store.Config{ClaimsTable: "a_very_long_table_name_that_is_longer_than_forty_eight_bytes"}},
	} {
		_, err := store.New(pool, tc.cfg)
		var ce *framework.ConfigError
		require.ErrorAs(t, err, &ce, "%+v", tc.cfg)
		require.Equal(t, tc.field, ce.Field)
	}
	_, err := store.New(nil, store.Config{})
	var ce *framework.ConfigError
	require.ErrorAs(t, err, &ce)
	require.Equal(t, "Pool", ce.Field)

}

// A consumer name that looks like SQL is stored as data, never executed.
func TestHostileConsumerIsData(t *testing.T) {
	t.Parallel()
	st := testenv.Migrated(t, 2)
	ctx := context.Background()
	hostile := `x'); DROP TABLE processed_messages; --`
	err := pgx.BeginFunc(ctx, st.Pool(), func(tx pgx.Tx) error {
		_, err := claimKey(ctx, st, tx, hostile, `k'; --`, 0)
		return err
	})
	require.NoError(t, err)
	tx := begin(t, st)
	ok, err := claimKey(ctx, st, tx, hostile, `k'; --`, 0)
	require.NoError(t, err)
	require.False(t, ok)
}

// IsTransient is the retry decision users see: the transient causes only.
func TestIsTransient(t *testing.T) {
	t.Parallel()
	for err, want := range map[error]bool{
		&pgconn.PgError{Code: "40001"}:                      true,
		fmt.Errorf("x: %w", &pgconn.PgError{Code: "55P03"}): true,
		io.ErrUnexpectedEOF:                                 true,
		&pgconn.PgError{Code: "23505"}:                      false,
		errors.New("x"):                                     false,
		fmt.Errorf("x: %w", context.Canceled):               false,
	} {
		require.Equal(t, want, store.IsTransient(err), "%v", err)
	}
	require.False(t, store.IsTransient(nil))
}

// A real dropped connection (the server kills the backend mid-transaction)
// classifies as a connection failure.
func TestClassifyRealConnectionLoss(t *testing.T) {
	t.Parallel()
	testenv.SkipBehindPooler(t, "terminates the backend of a connection it holds; through a pooler the kill itself may run on that backend, and the next statement on another")
	st := testenv.Store(t, 3)
	ctx := context.Background()
	conn, err := st.Pool().Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	var pid int
	require.NoError(t, conn.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid))
	_, err = st.Pool().Exec(ctx, "SELECT pg_terminate_backend($1)", pid)
	require.NoError(t, err)
	_, err = conn.Exec(ctx, "SELECT 1")
	require.Error(t, err)
	require.Equal(t, pg.Connection, pg.Classify(err), "%T %v", err, err)
}

func TestClaimFingerprint(t *testing.T) {
	t.Parallel()
	st := testenv.Migrated(t, 2)
	ctx := context.Background()
	claim := func(r store.ClaimRequest) store.ClaimResult { return claimWith(t, st, r) }
	h1, h2 := []byte{1, 2, 3}, []byte{9, 9, 9}
	require.Equal(t, store.ClaimResult{New: true}, claim(store.ClaimRequest{Consumer: "c", Key: "k", PayloadHash: h1, MaxClaimWait: time.Second}))
	require.Equal(t, store.ClaimResult{}, claim(store.ClaimRequest{Consumer: "c", Key: "k", PayloadHash: h1}))
	require.Equal(t, store.ClaimResult{FingerprintMismatch: true}, claim(store.ClaimRequest{Consumer: "c", Key: "k", PayloadHash: h2, MaxClaimWait: time.Second}))
	require.Equal(t, store.ClaimResult{}, claim(store.ClaimRequest{Consumer: "c", Key: "k"}), "no hash given: nothing compared")
	// A claim recorded without a fingerprint never mismatches.
	require.Equal(t, store.ClaimResult{New: true}, claim(store.ClaimRequest{Consumer: "c", Key: "old"}))
	require.Equal(t, store.ClaimResult{}, claim(store.ClaimRequest{Consumer: "c", Key: "old", PayloadHash: h2}))
	_, err := st.Claim(ctx, nil, store.ClaimRequest{})
	require.Error(t, err, 0)
}

// Beginning with a claim (the middleware's way): BEGIN and the claim in one batch, the same results as
// Claim, the transaction's options applied, the claim's lock_timeout
// gone for the effects, and every failure giving the connection back.
func TestBeginClaim(t *testing.T) {
	t.Parallel()
	st := testenv.Migrated(t, 2)
	ctx := context.Background()
	h1, h2 := []byte{1, 2, 3}, []byte{9, 9, 9}
	claim := func(r store.ClaimRequest, commit bool) store.ClaimResult {
		t.Helper()
		tx, res, err := st.BeginClaimForTest(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead}, r)
		require.NoError(t, err)
		var iso, lockTimeout string
		require.NoError(t, tx.QueryRow(ctx, "SELECT current_setting('transaction_isolation'), current_setting('lock_timeout')").Scan(&iso, &lockTimeout))
		require.Equal(t, "repeatable read", iso)
		require.Equal(t, "0", lockTimeout, "the handler must not inherit the claim's lock_timeout")
		if commit {
			require.NoError(t, tx.Commit(ctx))
		} else {
			require.NoError(t, tx.Rollback(ctx))
		}
		return res
	}
	require.Equal(t, store.ClaimResult{New: true}, claim(store.ClaimRequest{Consumer: "c", Key: "k", MaxClaimWait: time.Second, PayloadHash: h1}, false))
	require.Equal(t, store.ClaimResult{New: true}, claim(store.ClaimRequest{Consumer: "c", Key: "k", MaxClaimWait: time.Second, PayloadHash: h1}, true),
		"a rolled-back claim leaves nothing behind")
	require.Equal(t, store.ClaimResult{}, claim(store.ClaimRequest{Consumer: "c", Key: "k", PayloadHash: h1}, true))
	require.Equal(t, store.ClaimResult{FingerprintMismatch: true}, claim(store.ClaimRequest{Consumer: "c", Key: "k", MaxClaimWait: time.Second, PayloadHash: h2}, true))

	// Behind an uncommitted twin: the lock_timeout error, and the
	// connection back in the pool (2 connections: a leak would block the
	// next Acquire).
	holder := begin(t, st)
	ok, err := claimKey(ctx, st, holder, "c", "held", 0)
	require.NoError(t, err)
	require.True(t, ok)
	for i := 0; i < 3; i++ {
		_, _, err = st.BeginClaimForTest(ctx, pgx.TxOptions{}, store.ClaimRequest{Consumer: "c", Key: "held", MaxClaimWait: 20 * time.Millisecond})
		require.Equal(t, pg.ClaimWait, pg.Classify(err))
	}
	require.Equal(t, int32(1), st.Pool().Stat().AcquiredConns(), "only the holder's connection is out")
	require.NoError(t, holder.Rollback(ctx))

	// A claim by event day on the plain table fails with its typed error.
	_, _, err = st.BeginClaimForTest(ctx, pgx.TxOptions{}, store.ClaimRequest{Consumer: "c", Key: "d", EventTime: time.Now()})
	require.Error(t, err)
	require.Equal(t, int32(0), st.Pool().Stat().AcquiredConns())

	// A cancelled context: no transaction, no connection kept.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	_, _, err = st.BeginClaimForTest(cctx, pgx.TxOptions{}, store.ClaimRequest{Consumer: "c", Key: "x"})
	require.ErrorIs(t, err, context.Canceled)
	require.Equal(t, int32(0), st.Pool().Stat().AcquiredConns())
}

// Beginning a natural-key transaction: BEGIN with the transaction's options and a lock_timeout
// for the whole transaction (whole milliseconds, at least 1), none for
// wait <= 0, and a failed BEGIN giving the connection back.
func TestBeginNaturalKey(t *testing.T) {
	t.Parallel()
	st := testenv.Migrated(t, 2)
	ctx := context.Background()
	for wait, want := range map[time.Duration]string{time.Second: "1s", 1500 * time.Millisecond: "1500ms", time.Microsecond: "1ms", 0: "0"} {
		tx, err := st.BeginNaturalKeyForTest(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead}, wait)
		require.NoError(t, err)
		var iso, lockTimeout string
		require.NoError(t, tx.QueryRow(ctx, "SELECT current_setting('transaction_isolation'), current_setting('lock_timeout')").Scan(&iso, &lockTimeout))
		require.Equal(t, "repeatable read", iso)
		require.Equal(t, want, lockTimeout, "wait %v", wait)
		require.NoError(t, tx.Rollback(ctx))
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	_, err := st.BeginNaturalKeyForTest(cctx, pgx.TxOptions{}, time.Second)
	require.ErrorIs(t, err, context.Canceled)
	require.Equal(t, int32(0), st.Pool().Stat().AcquiredConns())
}

func TestSchemaVersionIsTheLatestMigration(t *testing.T) {
	t.Parallel()
	require.Equal(t, migrate.Latest(), store.SchemaVersion)
}

// Migration 005 is online on existing tables: the xact column is added
// without a rewrite (the tables keep their files), rows written before it
// read NULL ("unknown transaction"), rows written after carry the id of
// their transaction, claims and outbox rows of one transaction the same.
// On a partitioned claim table every partition, and every partition
// created later, gets the column and its default.
func TestMigrationTransactionIDsOnline(t *testing.T) {
	t.Parallel()
	for _, partitioned := range []bool{false, true} {
		t.Run(fmt.Sprintf("partitioned=%v", partitioned), func(t *testing.T) {
			t.Parallel()
			st := testenv.Migrated(t, 4)
			ctx := context.Background()
			outbox := pgx.Identifier{st.Config().Schema, st.Config().OutboxTable}.Sanitize()
			claim := func(key string) {
				t.Helper()
				require.NoError(t, pgx.BeginFunc(ctx, st.Pool(), func(tx pgx.Tx) error {
					r := store.ClaimRequest{Consumer: "loyalty", Key: key}
					if partitioned {
						r.EventTime = time.Now()
					}
					if _, err := st.Claim(ctx, tx, r); err != nil {
						return err
					}
					_, err := tx.Exec(ctx, "INSERT INTO "+outbox+" (topic, uuid, idempotency_key, payload) VALUES ('t', $1, $1, '')", key)
					return err
				}))
			}
			if partitioned {
				_, err := st.EnablePartitioning(ctx, store.RetentionConfig{})
				require.NoError(t, err)
			}
			// The schema as an older claimtx left it, with rows.
			require.NoError(t, st.MigrateDownForTest(ctx, 4))
			claim("before")
			files := func() map[string]int64 {
				return testenv.Pairs[string, int64](t, st.Pool(), `SELECT c.relname, c.relfilenode::int8 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = $1 AND c.relkind IN ('r', 'p')`, st.Config().Schema)
			}
			before := files()

			require.NoError(t, st.Migrate(ctx))
			after := files()
			for name := range after {
				if _, existed := before[name]; !existed {
					delete(after, name) // a table the later migrations create
				}
			}
			require.Equal(t, before, after, "no table was rewritten")
			claim("after")

			var nullBefore bool
			require.NoError(t, st.Pool().QueryRow(ctx, "SELECT xact IS NULL FROM "+claimsTable(st)+" WHERE message_key = 'before'").Scan(&nullBefore))
			require.True(t, nullBefore, "a claim from before the migration has no transaction")
			var claimX, outboxX *string
			require.NoError(t, st.Pool().QueryRow(ctx, "SELECT c.xact::text, o.xact::text FROM "+claimsTable(st)+" c, "+outbox+" o WHERE c.message_key = 'after' AND o.uuid = 'after'").Scan(&claimX, &outboxX))
			require.NotNil(t, claimX)
			require.Equal(t, claimX, outboxX, "claim and outbox row of one transaction share its id")

			if partitioned {
				// Every partition, and one created after the migration,
				// carries the default.
				_, err := st.CreatePartitionsAhead(ctx, store.RetentionConfig{Ahead: 9})
				require.NoError(t, err)
				var missing int
				require.NoError(t, st.Pool().QueryRow(ctx, `SELECT count(*) FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
WHERE i.inhparent = $1::regclass AND NOT EXISTS (
  SELECT 1 FROM pg_attribute a JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
  WHERE a.attrelid = c.oid AND a.attname = 'xact' AND pg_get_expr(d.adbin, d.adrelid) = 'pg_current_xact_id()')`, claimsTable(st)).Scan(&missing))
				require.Zero(t, missing, "partitions without the xact default")
			}
		})
	}
}

func TestClaimBatch(t *testing.T) {
	t.Parallel()
	st := testenv.Migrated(t, 2)
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
	st := testenv.Migrated(t, 2)
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
	st := testenv.Migrated(t, 2)
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

// msg is testenv.Message under the UUID uuid ("" for none, which Enqueue
// fills).
func msg(uuid, payload string, metadata ...string) *message.Message {
	m := testenv.Message(payload, metadata...)
	m.UUID = uuid
	return m
}

func TestEnqueueCommitsWithTheTransaction(t *testing.T) {
	t.Parallel()
	st := testenv.Migrated(t, 4)
	ctx := context.Background()

	// Rolled back: nothing.
	err := pgx.BeginFunc(ctx, st.Pool(), func(tx pgx.Tx) error {
		require.NoError(t, st.Enqueue(ctx, tx, "receipts", msg("u0", "lost")))
		return errors.New("handler failed")
	})
	require.Error(t, err)
	stats, err := st.OutboxStats(ctx)
	require.NoError(t, err)
	require.Equal(t, store.OutboxStats{}, stats)

	// Committed: in order, with metadata, a generated idempotency key
	// unless the message brought its own, and a UUID when it had none.
	require.NoError(t, pgx.BeginFunc(ctx, st.Pool(), func(tx pgx.Tx) error {
		if err := st.Enqueue(ctx, tx, "receipts",
			msg("u1", `{"n":1}`, "event_id", "e1"),
			msg("u2", "", store.IdempotencyKeyMetadata, "receipt:9912"),
		); err != nil {
			return err
		}
		return st.Enqueue(ctx, tx, "audit", msg("", "x"))
	}))
	stats, err = st.OutboxStats(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(3), stats.Pending)
	require.Positive(t, stats.OldestPending)

	tx := begin(t, st)
	rows, err := st.OutboxForTest().LockPending(ctx, tx, 10)
	require.NoError(t, err)
	require.Len(t, rows, 3)
	require.Equal(t, []string{"receipts", "receipts", "audit"}, []string{rows[0].Topic, rows[1].Topic, rows[2].Topic})
	require.Less(t, rows[0].ID, rows[1].ID)
	require.Equal(t, "u1", rows[0].UUID)
	require.Equal(t, `{"n":1}`, string(rows[0].Payload))
	require.Equal(t, map[string]string{"event_id": "e1"}, rows[0].Metadata)
	require.NotEmpty(t, rows[0].IdempotencyKey)
	require.Equal(t, "receipt:9912", rows[1].IdempotencyKey)
	require.Empty(t, rows[1].Metadata, "the idempotency key lives in its column, not twice")
	require.Equal(t, []byte{}, rows[1].Payload)
	require.NotEmpty(t, rows[2].UUID)

	m := rows[0].Message()
	require.Equal(t, "u1", m.UUID)
	require.Equal(t, rows[0].IdempotencyKey, m.Metadata.Get(store.IdempotencyKeyMetadata))
	require.Equal(t, "e1", m.Metadata.Get("event_id"))
	// The key is stable: the same row gives the same message again.
	require.Equal(t, m.Metadata, rows[0].Message().Metadata)
}

func TestEnqueueRefusesWhatNoBrokerTakes(t *testing.T) {
	t.Parallel()
	st := testenv.Migrated(t, 2)
	ctx := context.Background()
	for _, tc := range []struct {
		name  string
		topic string
		m     *message.Message
	}{
		{"empty topic", "", msg("u", "")},
		{"long topic", strings.Repeat("t", pg.MaxOutboxTopicBytes+1), msg("u", "")},
		{"NUL topic", "a\x00b", msg("u", "")},
		{"nil message", "t", nil},
		{"NUL metadata", "t", msg("u", "", "k", "a\x00")},
		{"invalid UTF-8 metadata", "t", msg("u", "", string([]byte{0xff}), "v")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tx := begin(t, st)
			err := st.Enqueue(ctx, tx, tc.topic, tc.m)
			require.ErrorIs(t, err, store.ErrInvalidOutboxMessage)
			require.True(t, framework.IsPermanent(err))
		})
	}
	require.Error(t, st.Enqueue(ctx, nil, "t", msg("u", "")))
	require.NoError(t, pgx.BeginFunc(ctx, st.Pool(), func(tx pgx.Tx) error { return st.Enqueue(ctx, tx, "t") }))
}

// Two relay transactions never hold the same row: the second skips what
// the first locked instead of waiting for it.
func TestLockPendingSkipsLockedRows(t *testing.T) {
	t.Parallel()
	st := testenv.Migrated(t, 4)
	ctx := context.Background()
	require.NoError(t, pgx.BeginFunc(ctx, st.Pool(), func(tx pgx.Tx) error {
		for i := 0; i < 5; i++ {
			if err := st.Enqueue(ctx, tx, "t", msg("", "p")); err != nil {
				return err
			}
		}
		return nil
	}))
	tx1 := begin(t, st)
	tx2 := begin(t, st)

	a, err := st.OutboxForTest().LockPending(ctx, tx1, 3)
	require.NoError(t, err)
	b, err := st.OutboxForTest().LockPending(ctx, tx2, 10)
	require.NoError(t, err)
	require.Len(t, a, 3)
	require.Len(t, b, 2)
	require.Greater(t, b[0].ID, a[2].ID)

	// tx1 marks its rows sent; tx2 records a failed publish of one row.
	require.NoError(t, st.OutboxForTest().MarkSent(ctx, tx1, []int64{a[0].ID, a[1].ID, a[2].ID}))
	require.NoError(t, st.OutboxForTest().MarkFailed(ctx, tx1, nil, nil))
	require.NoError(t, tx1.Commit(ctx))
	require.NoError(t, st.OutboxForTest().MarkFailed(ctx, tx2, []int64{b[0].ID}, errors.New("broker down")))
	require.NoError(t, tx2.Commit(ctx))

	stats, err := st.OutboxStats(ctx)
	require.NoError(t, err)
	require.Equal(t, store.OutboxStats{Pending: 2, Sent: 3, Failing: 1, OldestPending: stats.OldestPending}, stats)

	_, err = st.OutboxForTest().LockPending(ctx, tx2, 0)
	require.Error(t, err)
	_, err = st.OutboxForTest().LockPending(ctx, nil, 1)
	require.Error(t, err)
}

func TestDeleteSentOutboxInBatches(t *testing.T) {
	t.Parallel()
	st := testenv.Migrated(t, 2)
	ctx := context.Background()
	require.NoError(t, pgx.BeginFunc(ctx, st.Pool(), func(tx pgx.Tx) error {
		ms := make([]*message.Message, 25)
		for i := range ms {
			ms[i] = msg("", "p")
		}
		return st.Enqueue(ctx, tx, "t", ms...)
	}))
	require.NoError(t, pgx.BeginFunc(ctx, st.Pool(), func(tx pgx.Tx) error {
		rows, err := st.OutboxForTest().LockPending(ctx, tx, 20)
		if err != nil {
			return err
		}
		ids := make([]int64, len(rows))
		for i, r := range rows {
			ids[i] = r.ID
		}
		return st.OutboxForTest().MarkSent(ctx, tx, ids)
	}))

	// Not old enough yet.
	n, err := st.OutboxForTest().DeleteSent(ctx, st.Pool(), time.Hour, 100)
	require.NoError(t, err)
	require.Zero(t, n)

	var total int64
	for {
		n, err := st.OutboxForTest().DeleteSent(ctx, st.Pool(), 0, 8)
		require.NoError(t, err)
		total += n
		if n < 8 {
			break
		}
	}
	require.Equal(t, int64(20), total)
	stats, err := st.OutboxStats(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(5), stats.Pending, "pending rows are never cleaned up")
	require.Zero(t, stats.Sent)
	_, err = st.OutboxForTest().DeleteSent(ctx, st.Pool(), 0, 0)
	require.Error(t, err)
}

// Enqueue notifies listening relays when, and only when, the transaction
// commits.
func TestEnqueueNotifiesAtCommit(t *testing.T) {
	t.Parallel()
	st := testenv.Migrated(t, 2)
	ctx := context.Background()
	// LISTEN needs a session: past any pooler (NOTIFY passes through one).
	conn, err := pgx.Connect(ctx, testenv.DirectURL())
	require.NoError(t, err)
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, "LISTEN "+pg.OutboxChannel)
	require.NoError(t, err)

	tx := begin(t, st)
	require.NoError(t, st.Enqueue(ctx, tx, "t", msg("", "p")))
	require.NoError(t, tx.Rollback(ctx))
	require.NoError(t, pgx.BeginFunc(ctx, st.Pool(), func(tx pgx.Tx) error {
		return st.Enqueue(ctx, tx, "t", msg("", "p"))
	}))

	// Other tests' stores notify on the same channel: wait for ours.
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for {
		n, err := conn.WaitForNotification(wctx)
		require.NoError(t, err)
		if n.Payload == pg.OutboxPayload(st.Config().Schema, st.Config().OutboxTable) {
			break
		}
	}
	stats, err := st.OutboxStats(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(1), stats.Pending)
}

func TestOutboxTableName(t *testing.T) {
	t.Parallel()
	pool, schema := testenv.Setup(t, 2)
	ctx := context.Background()
	st, err := store.New(pool, store.Config{Schema: schema, OutboxTable: "my_outbox"})
	require.NoError(t, err)
	require.NoError(t, st.Migrate(ctx))
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return st.Enqueue(ctx, tx, "t", msg("", "p")) }))
	var n int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM "+pgx.Identifier{schema, "my_outbox"}.Sanitize()).Scan(&n))
	require.Equal(t, 1, n)

	for _, cfg := range []store.Config{
		{OutboxTable: "Outbox"},
		{OutboxTable: "x; drop"},
		{OutboxTable: "processed_messages"},
		{OutboxTable: "processed_messages_poison_memo"},
		{OutboxTable: "processed_messages_dead_letter"},
	} {
		_, err := store.New(pool, cfg)
		var ce *framework.ConfigError
		require.ErrorAs(t, err, &ce)
		require.Equal(t, "OutboxTable", ce.Field)
	}
}
