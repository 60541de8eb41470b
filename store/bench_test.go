package store_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/claimtx/claimtx/internal/pgtest"
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
	pool, schema := pgtest.Setup(b, 6)
	st, err := store.New(pool, store.Config{Schema: schema})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	if err := st.Migrate(ctx); err != nil {
		b.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE balances (customer_id bigint PRIMARY KEY, points bigint NOT NULL);
CREATE TABLE point_ledger (customer_id bigint NOT NULL, order_id bigint NOT NULL, points bigint NOT NULL)`); err != nil {
		b.Fatal(err)
	}
	const memoFill = 10000
	if _, err := pool.Exec(ctx, `INSERT INTO `+pgx.Identifier{schema, "processed_messages_poison_memo"}.Sanitize()+
		` (consumer, message_key, reason) SELECT 'bench', 'poisoned:' || g, 'bad order' FROM generate_series(1, $1) g`, memoFill); err != nil {
		b.Fatal(err)
	}
	var seq atomic.Int64
	effect := func(tx pgx.Tx, i int64) error {
		if _, err := tx.Exec(ctx, `INSERT INTO balances (customer_id, points) VALUES ($1, 1)
			ON CONFLICT (customer_id) DO UPDATE SET points = balances.points + EXCLUDED.points`, i%1000); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO point_ledger (customer_id, order_id, points) VALUES ($1, $2, 1)`, i%1000, i)
		return err
	}
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
		b.Run(m.name, func(b *testing.B) {
			b.SetParallelism(2) // 4 goroutines on 2 cores
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					i := seq.Add(1)
					tx, err := m.begin(i)
					if err == nil {
						if err = effect(tx, i); err == nil {
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
		})
	}
}
