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
	lookups, statements atomic.Int64
}

func (l *lookupTrips) TraceBatchQuery(_ context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	l.statements.Add(1)
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
		count := func(ordered bool, id int64) (trips, statements int64) {
			c := middleware.Claim{Store: st, Consumer: fmt.Sprintf("rt-order-%v", ordered), Key: keyFunc(t), MaxGroup: 1}
			if ordered {
				c.OrderKey = customerOrderKey(t)
			}
			h := testenv.Install(t, middleware.NewClaim, c)(consume(credit))
			before, beforeStatements := rt.n.Load(), rt.statements.Load()
			_, err := h(newDelivery(t, order{OrderID: id, CustomerID: 1, TotalCents: 100}))
			require.NoError(t, err)
			return rt.n.Load() - before, rt.statements.Load() - beforeStatements
		}
		plain, plainStatements := count(false, 1)
		require.Zero(t, rt.lookups.Load())
		ordered, orderedStatements := count(true, 2)
		require.EqualValues(t, 1, rt.lookups.Load(), "the ordered claim sent its lookup")
		require.EqualValues(t, 4, plain, "BEGIN+claim, two effect statements, COMMIT")
		require.Equal(t, plain, ordered, "per message: the order-key lookup costs no round trip")
		// The lookup rides in the statement that sets the claim's
		// lock_timeout: the server runs no statement more either.
		require.Equal(t, plainStatements, orderedStatements, "per message: the order-key lookup costs no statement")
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

// The order-key lookup rides in the statement that sets the claim's
// lock_timeout: its wait for a key row a release holds FOR UPDATE must be
// bounded by MaxClaimWait all the same, failing the message transiently
// (for the broker to redeliver) instead of holding it for the release.
func TestOrderKeyLookupWaitBounded(t *testing.T) {
	t.Parallel()
	b := setup(t, 4)
	ctx := context.Background()
	const consumer = "order-wait"
	b.exec(t, "INSERT INTO "+b.table("processed_messages_parked_keys")+" (consumer, order_key, reason) VALUES ($1, $2, $3)", consumer, "customer-7", "test")
	release, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { require.NoError(t, release.Rollback(ctx)) }()
	_, err = release.Exec(ctx, "SELECT 1 FROM "+b.table("processed_messages_parked_keys")+" WHERE consumer = $1 FOR UPDATE", consumer)
	require.NoError(t, err)

	var causes []string
	c := middleware.Claim{Store: b.store, Consumer: consumer, Key: keyFunc(t), OrderKey: customerOrderKey(t), MaxGroup: 1,
		MaxClaimWait: 100 * time.Millisecond, MaxAttempts: 2, OnRetry: func(r middleware.TxRetry) { causes = append(causes, r.Cause) }}
	h := testenv.Install(t, middleware.NewClaim, c)(consume(credit))
	done := make(chan error, 1)
	go func() {
		_, err := h(newDelivery(t, order{OrderID: 1, CustomerID: 7, TotalCents: 100}))
		done <- err
	}()
	select {
	case err := <-done:
		require.Error(t, err, "the key row stayed locked: the message cannot be applied")
		require.False(t, framework.IsPermanent(err), "a lock wait is transient: redelivered, never poisoned")
	case <-time.After(30 * time.Second):
		t.Fatal("the lookup waited for the release, unbounded by MaxClaimWait")
	}
	require.Equal(t, []string{"claim_wait"}, causes)
}
