package main

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
)

// runRaw is the database limit: claim + effect per message in one pgx
// transaction, with no broker and no Watermill.
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
				err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
					claimed, err := e.store.Claim(ctx, tx, "bench", fmt.Sprintf("order-completed:%d", o.OrderID))
					if err != nil || !claimed {
						return err
					}
					return effect(ctx, tx, o)
				})
				if err != nil {
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
