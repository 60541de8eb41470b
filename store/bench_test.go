package store_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/claimtx/claimtx/internal/pg"
	"github.com/claimtx/claimtx/internal/testenv"
	"github.com/claimtx/claimtx/store"
)

// BenchmarkClaimCost measures what the claim adds to a transaction per
// message on the server, without a broker: four goroutines loop the
// loyalty effect (an upsert and an insert) in their own transactions,
// "effect" alone, "claim" with the claim INSERT in the BEGIN batch, and
// "claim-wait" as the middleware sends it (BeginClaim with a
// lock_timeout set and reset around the claim), "claim-wait-memo" with
// the poison memo lookup in the same pipeline. ns/op is per transaction
// across all four; compare the rows of one run.
func BenchmarkClaimCost(b *testing.B) {
	pool, schema := testenv.Setup(b, 6)
	st, err := store.New(pool, store.Config{Schema: schema})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	if err := st.Migrate(ctx); err != nil {
		b.Fatal(err)
	}
	loyaltyTables(b, pool)
	const memoFill = 10000
	if _, err := pool.Exec(ctx, `INSERT INTO `+pgx.Identifier{schema, "processed_messages_poison_memo"}.Sanitize()+
		` (consumer, message_key, reason) SELECT 'bench', 'poisoned:' || g, 'bad order' FROM generate_series(1, $1) g`, memoFill); err != nil {
		b.Fatal(err)
	}
	var seq atomic.Int64
	modes := []struct {
		name  string
		begin func(i int64) (pgx.Tx, error)
	}{
		{"effect", func(int64) (pgx.Tx, error) { return pool.Begin(ctx) }},
		{"claim", func(i int64) (pgx.Tx, error) {
			tx, _, err := st.BeginClaimForTest(ctx, pgx.TxOptions{}, store.ClaimRequest{
				Consumer: "bench", Key: "order-completed:" + strconv.FormatInt(i, 10)})
			return tx, err
		}},
		{"claim-wait", func(i int64) (pgx.Tx, error) {
			tx, _, err := st.BeginClaimForTest(ctx, pgx.TxOptions{}, store.ClaimRequest{
				Consumer: "bench", Key: "order-completed:w" + strconv.FormatInt(i, 10), MaxClaimWait: 5 * time.Second})
			return tx, err
		}},
		// The poison memo lookup pipelined with BEGIN and the claim
		// (middleware.Claim.PoisonMemo), against a memo table holding
		// memoFill other keys.
		{"claim-wait-memo", func(i int64) (pgx.Tx, error) {
			tx, _, _, err := st.BeginClaimMemoForTest(ctx, pgx.TxOptions{}, store.ClaimRequest{
				Consumer: "bench", Key: "order-completed:m" + strconv.FormatInt(i, 10), MaxClaimWait: 5 * time.Second})
			return tx, err
		}},
	}
	for _, m := range modes {
		b.Run(m.name, func(b *testing.B) { runClaimTx(b, &seq, m.begin) })
	}
}

// loyaltyTables creates the loyalty effect's tables in pool's schema.
func loyaltyTables(b *testing.B, pool *pgxpool.Pool) {
	if _, err := pool.Exec(context.Background(), `CREATE TABLE balances (customer_id bigint PRIMARY KEY, points bigint NOT NULL);
CREATE TABLE point_ledger (customer_id bigint NOT NULL, order_id bigint NOT NULL, points bigint NOT NULL)`); err != nil {
		b.Fatal(err)
	}
}

// runClaimTx runs transactions opened by begin, each applying the loyalty
// effect (balance upsert, ledger row) and committing, from 4 goroutines
// on 2 cores.
func runClaimTx(b *testing.B, seq *atomic.Int64, begin func(i int64) (pgx.Tx, error)) {
	ctx := context.Background()
	b.SetParallelism(2) // 4 goroutines on 2 cores
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			i := seq.Add(1)
			tx, err := begin(i)
			if err == nil {
				if _, err = tx.Exec(ctx, `INSERT INTO balances (customer_id, points) VALUES ($1, 1)
			ON CONFLICT (customer_id) DO UPDATE SET points = balances.points + EXCLUDED.points`, i%1000); err == nil {
					_, err = tx.Exec(ctx, `INSERT INTO point_ledger (customer_id, order_id, points) VALUES ($1, $2, 1)`, i%1000, i)
				}
				if err == nil {
					err = tx.Commit(ctx)
				} else {
					_ = tx.Rollback(ctx)
				}
			}
			if err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// BenchmarkClaimSchema measures candidate claim tables for issue 16 part 2
// ("a claim that is nearly free"): the claim transaction of
// BenchmarkClaimCost ("claim" mode: BEGIN and the claim INSERT in one
// pipelined batch, then the loyalty effect, COMMIT) against the table as
// the migrations make it and against variants of it, each in its own
// schema. Compare the variants with benchstat:
//
//	go test -run '^$' -bench ClaimSchema -count 5 ./store/ | tee claimschema.txt
//
// Variants:
//   - migrated: primary key (consumer, message_key), btree on processed_at,
//     xact defaulting to pg_current_xact_id() (migration 005).
//   - no-xact: without that default (what migration 005 costs).
//   - brin: a BRIN index on processed_at instead of the btree.
//   - no-time-index: no index on processed_at at all (what a table
//     partitioned by event day could do: retention drops partitions).
func BenchmarkClaimSchema(b *testing.B) {
	variants := []struct{ name, sql string }{
		{"migrated", ``},
		{"no-xact", `ALTER TABLE {schema}.{claims} ALTER COLUMN xact DROP DEFAULT`},
		{"brin", `DROP INDEX {schema}.{claims_processed_at_idx}; CREATE INDEX {claims_processed_at_idx} ON {schema}.{claims} USING brin (processed_at)`},
		{"no-time-index", `DROP INDEX {schema}.{claims_processed_at_idx}`},
	}
	ctx := context.Background()
	for _, v := range variants {
		b.Run(v.name, func(b *testing.B) {
			pool, schema := testenv.Setup(b, 6)
			st, err := store.New(pool, store.Config{Schema: schema})
			if err != nil {
				b.Fatal(err)
			}
			if err := st.Migrate(ctx); err != nil {
				b.Fatal(err)
			}
			if v.sql != "" {
				if _, err := pool.Exec(ctx, pg.NewNames(schema, "processed_messages", "outbox").Render(v.sql)); err != nil {
					b.Fatal(err)
				}
			}
			loyaltyTables(b, pool)
			var seq atomic.Int64
			runClaimTx(b, &seq, func(i int64) (pgx.Tx, error) {
				tx, _, err := st.BeginClaimForTest(ctx, pgx.TxOptions{}, store.ClaimRequest{
					Consumer: "bench", Key: "order-completed:" + strconv.FormatInt(i, 10), MaxClaimWait: 5 * time.Second})
				return tx, err
			})
		})
	}
}
