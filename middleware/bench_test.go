package middleware_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/claimtx/claimtx/internal/pg"
	"github.com/claimtx/claimtx/internal/testenv"
	"github.com/claimtx/claimtx/middleware"
)

// benchOrders makes n deliveries of orders never used before in this
// process: the benchmark framework calls each benchmark several times, and
// a repeated key would be a duplicate, not the measured path.
func benchOrders(b *testing.B, n int) []*message.Message {
	msgs := make([]*message.Message, n)
	for i := range msgs {
		benchOrderSeq++
		msgs[i] = newDelivery(b, order{OrderID: benchOrderSeq, CustomerID: benchOrderSeq%100 + 1, TotalCents: 100})
	}
	return msgs
}

var benchOrderSeq int64

// BenchmarkClaimPerMessage measures what the middleware adds to one claim
// transaction, against real Postgres: "pgx" is the same work written by
// hand (the store's BEGIN+claim round trip, the effect, COMMIT), "middleware" is
// the NewClaim middleware around TxHandler(credit). The difference in ns/op and
// allocs/op between the two, measured in the same run, is the
// middleware's own cost per message (key derivation and validation,
// result bookkeeping, the transaction in the message context).
func BenchmarkClaimPerMessage(b *testing.B) {
	bu := setup(b, 4)
	ctx := context.Background()
	b.Run("pgx", func(b *testing.B) {
		msgs := benchOrders(b, b.N)
		claims := pg.ClaimsOf(bu.store)
		b.ReportAllocs()
		b.ResetTimer()
		for _, msg := range msgs {
			tx, _, _, err := claims.Begin(ctx, pg.TxOptions{}, pg.ClaimRequest{
				Consumer: "pgx", Key: "order-completed:" + msg.Metadata.Get("event_id"), MaxClaimWait: 5 * time.Second, // the claim's default MaxClaimWait
			}, pg.Lookups{}, nil)
			if err == nil {
				if err = credit(ctx, tx, msg); err == nil {
					err = tx.Commit(ctx)
				}
			}
			if err != nil {
				b.Fatal(err)
			}
		}
	})
	// An idle consumer (one message at a time) under group commit, the
	// default, and with one transaction per message: p99-µs compares their
	// latency, which must not grow with groups.
	benchFresh(b, "middleware", testenv.Install(b, middleware.NewClaim, bu.claim(b, "middleware", nil))(consume(credit)))
	single := bu.claim(b, "middleware-single", nil)
	single.MaxGroup = 1
	benchFresh(b, "middleware-single", testenv.Install(b, middleware.NewClaim, single)(consume(credit)))
	// The same with Claim.OrderKey (one key per customer, nothing parked):
	// the parked-key lookup rides in the claim's pipeline as the memo's
	// does, per message and under group commit.
	orderedSingle := single
	orderedSingle.Consumer, orderedSingle.OrderKey = "middleware-single-ordered", customerOrderKey(b)
	benchFresh(b, "middleware-single-ordered", testenv.Install(b, middleware.NewClaim, orderedSingle)(consume(credit)))
	ordered := bu.claim(b, "middleware-ordered", nil)
	ordered.OrderKey = customerOrderKey(b)
	benchFresh(b, "middleware-ordered", testenv.Install(b, middleware.NewClaim, ordered)(consume(credit)))
	// The same with Claim.PoisonMemo: the memo lookup rides in the claim's
	// pipeline, so a fresh message pays a statement, not a round trip.
	memo := bu.claim(b, "middleware-memo", nil)
	memo.PoisonMemo = true
	benchFresh(b, "middleware-memo", testenv.Install(b, middleware.NewClaim, memo)(consume(credit)))
}

// benchFresh runs the sub-benchmark name: h over b.N orders never seen.
func benchFresh(b *testing.B, name string, h message.HandlerFunc) {
	b.Run(name, func(b *testing.B) {
		msgs := benchOrders(b, b.N)
		lat := make([]time.Duration, len(msgs))
		b.ReportAllocs()
		b.ResetTimer()
		for i, msg := range msgs {
			t0 := time.Now()
			if _, err := h(msg); err != nil {
				b.Fatal(err)
			}
			lat[i] = time.Since(t0)
		}
		b.StopTimer()
		slices.Sort(lat)
		b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
	})
}

// BenchmarkBatchSet is Batch.Process over batches of 100 with the set-wise
// credit; one op is one message.
func BenchmarkBatchSet(b *testing.B) {
	bu := setup(b, 4)
	bt := bu.batch(b, nil)
	ctx := context.Background()
	const size = 100
	msgs := benchOrders(b, b.N)
	b.ReportAllocs()
	b.ResetTimer()
	for start := 0; start < len(msgs); start += size {
		for i, err := range bt.Process(ctx, msgs[start:min(start+size, len(msgs))], creditSet) {
			if err != nil {
				b.Fatal(fmt.Errorf("message %d: %w", start+i, err))
			}
		}
	}
}

// BenchmarkClaimDuplicateWarm is a duplicate storm's message when the
// committed-key cache knows the key: no database, the key derived and
// looked up. Each message runs in a goroutine of its own, as Watermill's
// router runs them, so what the middleware's stack needs beyond a fresh
// goroutine's is in the figure; "bare" is the same with a handler that
// does nothing, the router's floor.
func BenchmarkClaimDuplicateWarm(b *testing.B) {
	bu := setup(b, 4)
	h := testenv.Install(b, middleware.NewClaim, bu.claim(b, "warm", nil))(consume(credit))
	msgs := benchOrders(b, 1000)
	for _, msg := range msgs {
		if _, err := h(msg); err != nil {
			b.Fatal(err)
		}
	}
	for _, m := range []struct {
		name string
		h    message.HandlerFunc
	}{
		{"bare", func(*message.Message) ([]*message.Message, error) { return nil, nil }},
		{"claim", h},
	} {
		b.Run(m.name, func(b *testing.B) {
			done := make(chan error)
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				msg := msgs[i%len(msgs)]
				i++
				go func() {
					_, err := m.h(msg)
					done <- err
				}()
				if err := <-done; err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
