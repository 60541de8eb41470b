package middleware_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/middleware"
)

// TestModelExactlyOnce drives the middleware with random interleavings of
// deliveries, redeliveries, handler failures and panics, with twins running
// concurrently, and checks the invariant against the simplest model: a
// broker that redelivers every unacked message until it is acked ends with
// every key's effect applied exactly once.
func TestModelExactlyOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, 8)
	ctx := context.Background()
	_, err := b.pool.Exec(ctx, "CREATE TABLE effects (consumer text NOT NULL, k text NOT NULL)")
	require.NoError(t, err)
	kf, err := framework.ParseKeySpec("metadata:event_id")
	require.NoError(t, err)

	iteration := 0
	rapid.Check(t, func(rt *rapid.T) {
		iteration++
		consumer := fmt.Sprintf("model-%d", iteration)
		nKeys := rapid.IntRange(1, 6).Draw(rt, "keys")
		c := middleware.Claim{Store: b.store, Consumer: consumer, Key: kf}
		var mu sync.Mutex
		failing := map[string]string{} // key -> "error" | "panic" for its next attempt
		h := install(t, middleware.NewClaim, c)(consume(func(ctx context.Context, tx pgx.Tx, msg *message.Message) error {
			k := msg.Metadata.Get("event_id")
			if _, err := tx.Exec(ctx, "INSERT INTO effects VALUES ($1, $2)", consumer, k); err != nil {
				return err
			}
			mu.Lock()
			mode := failing[k]
			delete(failing, k)
			mu.Unlock()
			switch mode {
			case "error":
				return errors.New("injected")
			case "panic":
				panic("injected")
			}
			return nil
		}))
		deliver := func(k string) error {
			msg := message.NewMessage(watermill.NewUUID(), nil)
			msg.Metadata.Set("event_id", k)
			msg.SetContext(ctx)
			_, err := h(msg)
			return err
		}

		acked := map[string]bool{}
		waves := rapid.IntRange(1, 5).Draw(rt, "waves")
		for w := 0; w < waves; w++ {
			batch := rapid.SliceOfN(rapid.IntRange(0, nKeys-1), 1, 10).Draw(rt, fmt.Sprintf("wave%d", w))
			mu.Lock()
			for _, i := range batch {
				k := fmt.Sprintf("k%d", i)
				switch rapid.IntRange(0, 3).Draw(rt, "fault") {
				case 1:
					failing[k] = "error"
				case 2:
					failing[k] = "panic"
				}
			}
			mu.Unlock()
			results := make([]error, len(batch))
			var wg sync.WaitGroup
			for j, i := range batch {
				wg.Add(1)
				go func() {
					defer wg.Done()
					results[j] = deliver(fmt.Sprintf("k%d", i))
				}()
			}
			wg.Wait()
			for j, i := range batch {
				if results[j] == nil {
					acked[fmt.Sprintf("k%d", i)] = true
				}
			}
		}
		// The broker redelivers whatever was delivered but never acked.
		mu.Lock()
		clear(failing)
		mu.Unlock()
		for i := 0; i < nKeys; i++ {
			k := fmt.Sprintf("k%d", i)
			if !acked[k] {
				if err := deliver(k); err != nil {
					rt.Fatalf("redelivery of %s failed: %v", k, err)
				}
			}
		}
		rows, err := b.pool.Query(ctx, "SELECT k, count(*) FROM effects WHERE consumer = $1 GROUP BY k", consumer)
		if err != nil {
			rt.Fatal(err)
		}
		counts := map[string]int{}
		for rows.Next() {
			var k string
			var n int
			if err := rows.Scan(&k, &n); err != nil {
				rt.Fatal(err)
			}
			counts[k] = n
		}
		if err := rows.Err(); err != nil {
			rt.Fatal(err)
		}
		for i := 0; i < nKeys; i++ {
			k := fmt.Sprintf("k%d", i)
			if counts[k] != 1 {
				rt.Fatalf("key %s applied %d times, want exactly 1", k, counts[k])
			}
		}
	})
}
