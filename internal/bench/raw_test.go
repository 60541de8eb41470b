//go:build bench

package bench

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// runRaw is the database limit: claim + effect per message in one pgx
// transaction, with no broker and no Watermill, written the fastest way
// pgx allows: BEGIN and the claim INSERT in one pipelined batch (no
// lock_timeout around it), then the effect, then COMMIT.
func runRaw(ctx context.Context, e *env, n, concurrency int) (result, error) {
	lat := make([]time.Duration, n)
	var next atomic.Int64
	var firstErr error
	var errOnce sync.Once
	var wg sync.WaitGroup
	start := time.Now()
	for w := 0; w < concurrency; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				t0 := time.Now()
				o := orderN(i)
				if _, err := rawClaimEffect(ctx, e, o); err != nil {
					errOnce.Do(func() { firstErr = err })
					return
				}
				lat[i] = time.Since(t0)
			}
		}()
	}
	wg.Wait()
	return result{n: n, elapsed: time.Since(start), lat: lat}, firstErr
}

// rawClaimEffect claims o and, when the claim row was inserted, applies its
// effect, in one transaction; claimed is false for a duplicate (the claim
// row existed: no effect, the transaction commits nothing).
func rawClaimEffect(ctx context.Context, e *env, o order) (claimed bool, err error) {
	b := &pgx.Batch{}
	b.BeginTx(pgx.TxOptions{})
	b.Queue(`INSERT INTO processed_messages (consumer, message_key) VALUES ($1, $2) ON CONFLICT DO NOTHING`,
		"bench", fmt.Sprintf("order-completed:%d", o.OrderID)).Exec(func(tag pgconn.CommandTag) error {
		claimed = tag.RowsAffected() == 1
		return nil
	})
	br := e.pool.SendBatch(ctx, b)
	tx := br.Tx()
	defer func() { _ = tx.Rollback(ctx) }()
	if err := br.Close(); err != nil {
		return false, err
	}
	if claimed {
		if err := effect(ctx, tx, o); err != nil {
			return false, err
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return false, err
	}
	return claimed, nil
}
