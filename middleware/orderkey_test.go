package middleware_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/internal/testenv"
	"github.com/claimtx/claimtx/middleware"
)

// customerOrderKey is the order key of the round-trip test and of
// BenchmarkClaimPerMessage's ordered variant: one order per customer.
func customerOrderKey(t testing.TB) framework.KeyFunc {
	t.Helper()
	return mustKeySpec(t, "template:customer-{payload.customer_id}")
}

// lookupTrips counts round trips as roundTrips does, and the parked
// order-key lookups sent inside them (the claim's batch).
type lookupTrips struct {
	roundTrips
	lookups atomic.Int64
}

func (l *lookupTrips) TraceBatchQuery(_ context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	if strings.Contains(d.SQL, "parked_keys") {
		l.lookups.Add(1)
	}
}

// With nothing parked, the order-key lookup rides in the claim's round
// trip: a fresh message costs as many round trips with Claim.OrderKey as
// without, one transaction per message (MaxGroup 1) and in a group (the
// group's first and each later step under its savepoint).
func TestOrderKeyAddsNoRoundTrip(t *testing.T) {
	t.Parallel()
	b := setup(t, 2)

	t.Run("per-message", func(t *testing.T) {
		t.Parallel()
		rt := &lookupTrips{}
		st := b.storeWith(t, func(cfg *pgxpool.Config) { cfg.ConnConfig.Tracer = rt })
		require.NoError(t, st.Pool().Ping(context.Background()))
		count := func(ordered bool, id int64) int64 {
			c := middleware.Claim{Store: st, Consumer: fmt.Sprintf("rt-order-%v", ordered), Key: keyFunc(t), MaxGroup: 1}
			if ordered {
				c.OrderKey = customerOrderKey(t)
			}
			h := testenv.Install(t, middleware.NewClaim, c)(consume(credit))
			before := rt.n.Load()
			_, err := h(newDelivery(t, order{OrderID: id, CustomerID: 1, TotalCents: 100}))
			require.NoError(t, err)
			return rt.n.Load() - before
		}
		plain := count(false, 1)
		require.Zero(t, rt.lookups.Load())
		ordered := count(true, 2)
		require.EqualValues(t, 1, rt.lookups.Load(), "the ordered claim sent its lookup")
		require.EqualValues(t, 4, plain, "BEGIN+claim, two effect statements, COMMIT")
		require.Equal(t, plain, ordered, "per message: the order-key lookup costs no round trip")
	})

	t.Run("group", func(t *testing.T) {
		t.Parallel()
		// A pool of one: the group's first holds the only connection in its
		// handler until the later messages wait for the claim, in order,
		// so all of them form one group whatever the machine's speed.
		rt := &lookupTrips{}
		st := b.storeWith(t, func(cfg *pgxpool.Config) { cfg.ConnConfig.Tracer, cfg.MaxConns = rt, 1 })
		require.NoError(t, st.Pool().Ping(context.Background()))
		const later = 4
		count := func(ordered bool, first int64) int64 {
			consumer := fmt.Sprintf("rt-order-group-%v", ordered)
			c := middleware.Claim{Store: st, Consumer: consumer, Key: keyFunc(t), MaxGroup: 16, MaxGroupTime: time.Minute}
			if ordered {
				c.OrderKey = customerOrderKey(t)
			}
			g := newGate(t, 1)
			h := testenv.Install(t, middleware.NewClaim, c)(consume(func(ctx context.Context, tx pgx.Tx, msg *message.Message) error {
				if msg.Metadata.Get("event_id") == fmt.Sprintf("evt-%d", first) {
					if err := g.hold(ctx); err != nil {
						return err
					}
				}
				return credit(ctx, tx, msg)
			}))
			before := rt.n.Load()
			ds := []*delivery{deliverAsync(t, context.Background(), h, order{OrderID: first, CustomerID: first, TotalCents: 100})}
			g.awaitEntered(t)
			for i := range int64(later) {
				d := deliverAsync(t, context.Background(), h, order{OrderID: first + 1 + i, CustomerID: first + 1 + i, TotalCents: 100})
				d.awaitQueued(t)
				ds = append(ds, d)
			}
			g.open()
			for _, d := range ds {
				require.NoError(t, d.wait(t), "order %d", d.o.OrderID)
			}
			n := rt.n.Load() - before
			require.Equal(t, int64(1), b.scalar(t, "SELECT count(DISTINCT xact::text) FROM "+b.table("processed_messages")+" WHERE consumer = $1", consumer),
				"the %d messages committed in one group", later+1)
			require.Equal(t, int64(later+1), b.claims(t, consumer))
			return n
		}
		plain := count(false, 100)
		require.Zero(t, rt.lookups.Load())
		ordered := count(true, 200)
		require.EqualValues(t, later+1, rt.lookups.Load(), "each step of the ordered group sent its lookup")
		t.Logf("a group of %d: %d round trips without the order key, %d with", later+1, plain, ordered)
		require.Equal(t, plain, ordered, "in a group: the order-key lookup costs no round trip")
	})
}
