package store_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/store"
)

func memoTable(st *store.Store) string {
	return pgx.Identifier{st.Config().Schema, st.Config().ClaimsTable + "_poison_memo"}.Sanitize()
}

// insertMemos inserts n poison memos for consumer last poisoned at now() +
// offset (an SQL interval).
func insertMemos(t *testing.T, st *store.Store, consumer, prefix string, n int, offset string) {
	t.Helper()
	_, err := st.Pool().Exec(context.Background(), fmt.Sprintf(
		`INSERT INTO %s (consumer, message_key, reason, poisoned_at)
		 SELECT $1, $2 || g, 'bad order', now() + $3::interval FROM generate_series(1, $4) g`, memoTable(st)), consumer, prefix, offset, n)
	require.NoError(t, err)
}

func memoCount(t *testing.T, st *store.Store) int64 {
	t.Helper()
	var n int64
	require.NoError(t, st.Pool().QueryRow(context.Background(), "SELECT count(*) FROM "+memoTable(st)).Scan(&n))
	return n
}

// Memos obey the claims' retention: Cleanup deletes those last poisoned
// before its horizon, in batches, after the claims; a dry run counts them.
func TestCleanupRemovesExpiredPoisonMemos(t *testing.T) {
	t.Parallel()
	st := migrated(t, 4)
	ctx := context.Background()
	insertMemos(t, st, "loyalty", "old-", 7, "-31 days")
	insertMemos(t, st, "loyalty", "young-", 3, "-29 days")
	insertAged(t, st, "loyalty", "k", 2, "-31 days")

	cfg := fixedBatches(2)
	cfg.DryRun = true
	res, err := st.Cleanup(ctx, cfg)
	require.NoError(t, err)
	require.EqualValues(t, 7, res.Memos)
	require.EqualValues(t, 10, memoCount(t, st), "a dry run deletes nothing")

	res, err = st.Cleanup(ctx, fixedBatches(2))
	require.NoError(t, err)
	require.EqualValues(t, 2, res.Deleted)
	require.EqualValues(t, 7, res.Memos)
	require.EqualValues(t, 3, memoCount(t, st))
	var young int64
	require.NoError(t, st.Pool().QueryRow(ctx, "SELECT count(*) FROM "+memoTable(st)+" WHERE message_key LIKE 'young-%'").Scan(&young))
	require.EqualValues(t, 3, young)

	// A schema without the memo table (migrated to 3 only) cleans claims
	// as before.
	require.NoError(t, st.MigrateDownForTest(ctx, 3))
	insertAged(t, st, "loyalty", "k", 1, "-31 days")
	res, err = st.Cleanup(ctx, fixedBatches(2))
	require.NoError(t, err)
	require.EqualValues(t, 1, res.Deleted)
	require.Zero(t, res.Memos)
}

// On a claim table partitioned by event day, DropExpiredPartitions deletes
// the memos (which are not partitioned) by time.
func TestDropExpiredPartitionsRemovesExpiredPoisonMemos(t *testing.T) {
	t.Parallel()
	cfg := store.RetentionConfig{Retention: 10 * 24 * time.Hour, Force: true}
	st, _ := partitionedStore(t, 4, cfg)
	ctx := context.Background()
	insertMemos(t, st, "loyalty", "old-", 4, "-11 days")
	insertMemos(t, st, "loyalty", "young-", 2, "-9 days")

	dry := cfg
	dry.DryRun = true
	_, err := st.DropExpiredPartitions(ctx, dry)
	require.NoError(t, err)
	require.EqualValues(t, 6, memoCount(t, st))
	_, err = st.DropExpiredPartitions(ctx, cfg)
	require.NoError(t, err)
	require.EqualValues(t, 2, memoCount(t, st))
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
			st := migrated(t, 4)
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
				rows, err := st.Pool().Query(ctx, `SELECT c.relname, c.relfilenode::int8 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = $1 AND c.relkind IN ('r', 'p')`, st.Config().Schema)
				require.NoError(t, err)
				out := map[string]int64{}
				for rows.Next() {
					var name string
					var node int64
					require.NoError(t, rows.Scan(&name, &node))
					out[name] = node
				}
				require.NoError(t, rows.Err())
				return out
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
