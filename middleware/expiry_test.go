package middleware_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/internal/kafkarecord"
	"github.com/claimtx/claimtx/internal/pg"
	"github.com/claimtx/claimtx/internal/testenv"
	"github.com/claimtx/claimtx/middleware"
	"github.com/claimtx/claimtx/store"
)

// guarded is the chain of the composed router around the loyalty handler,
// with the expiry guard before the claim:
// Poison -> ExpiryGuard -> Claim -> credit.
type guarded struct {
	b       bundle
	handler message.HandlerFunc
	dead    deadLetters
	mu      sync.Mutex
	expired []*framework.ExpiredError
}

func newGuarded(t *testing.T, allowExpired bool, now time.Time) *guarded {
	t.Helper()
	g := &guarded{b: setup(t, 4), dead: newDeadLetters(t)}

	eventTime, err := framework.ParseTimeSpec("metadata:event_time")
	require.NoError(t, err)
	guard := middleware.ExpiryGuardAt(middleware.ExpiryGuard{
		Retention:    30 * 24 * time.Hour,
		EventTime:    eventTime,
		AllowExpired: allowExpired,
		OnExpired: func(_ *message.Message, err *framework.ExpiredError) {
			g.mu.Lock()
			defer g.mu.Unlock()
			g.expired = append(g.expired, err)
		},
	}, now)
	poison := middleware.Poison{Publisher: g.dead, Topic: "orders.poison"}
	claim := g.b.claim(t, "loyalty", nil)
	g.handler = testenv.Install(t, middleware.NewPoison, poison)(testenv.Install(t, middleware.NewExpiryGuard, guard)(testenv.Install(t, middleware.NewClaim, claim)(consume(credit))))
	return g
}

func (g *guarded) expiredCount() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.expired)
}

func deliveryAt(t *testing.T, o order, at time.Time) *message.Message {
	msg := newDelivery(t, o)
	msg.Metadata.Set("event_time", at.Format(time.RFC3339Nano))
	return msg
}

// A dead-letter replay of a 40-day-old event under a 30-day retention: its
// claim may be gone, so it is poisoned with the reason, never applied.
func TestExpiryGuardPoisonsOldReplay(t *testing.T) {
	t.Parallel()
	now := time.Date(2024, 6, 10, 12, 0, 0, 0, time.UTC)
	g := newGuarded(t, false, now)
	o := order{OrderID: 9912, CustomerID: 7, TotalCents: 5000}

	_, err := g.handler(deliveryAt(t, o, now.AddDate(0, 0, -40)))
	require.NoError(t, err, "poisoned and acked")
	got := g.dead.next(t, "the expired message was not poisoned")
	reason := got.Metadata.Get(middleware.PoisonReasonKey)
	require.Contains(t, reason, "message expired")
	require.Contains(t, reason, "2024-05-01T12:00:00Z", "the event time")
	require.Contains(t, reason, "2024-05-11T12:00:00Z", "the horizon")
	require.Contains(t, reason, "retention 30d")
	require.Equal(t, "true", got.Metadata.Get("claimtx_poison_permanent"))
	require.Equal(t, "evt-9912", got.Metadata.Get("event_id"))
	require.EqualValues(t, 0, g.b.balance(t, 7), "not applied")
	require.EqualValues(t, 0, g.b.claims(t, "loyalty"), "not even claimed")
	require.Equal(t, 1, g.expiredCount())
	require.ErrorAs(t, g.expired[0], new(*framework.ExpiredError))

	// Inside the window (29 days, and the exact horizon): applied once.
	for i, at := range []time.Time{now.AddDate(0, 0, -29), now.AddDate(0, 0, -30)} {
		o := order{OrderID: int64(100 + i), CustomerID: 8, TotalCents: 1000}
		for range 2 {
			_, err := g.handler(deliveryAt(t, o, at))
			require.NoError(t, err)
		}
		require.EqualValues(t, 1, g.b.ledgerRows(t, o.OrderID))
	}
	require.EqualValues(t, 20, g.b.balance(t, 8))
	require.Equal(t, 1, g.expiredCount())

	// No event time: it cannot be checked either, so it is poisoned.
	_, err = g.handler(newDelivery(t, order{OrderID: 5, CustomerID: 9, TotalCents: 100}))
	require.NoError(t, err)
	got = g.dead.next(t, "the message without event time was not poisoned")
	require.Contains(t, got.Metadata.Get(middleware.PoisonReasonKey), "invalid event time")
	require.EqualValues(t, 0, g.b.balance(t, 9))
}

func TestExpiryGuardAllowExpired(t *testing.T) {
	t.Parallel()
	now := time.Now()
	g := newGuarded(t, true, now)
	o := order{OrderID: 1, CustomerID: 3, TotalCents: 700}
	_, err := g.handler(deliveryAt(t, o, now.AddDate(0, 0, -40)))
	require.NoError(t, err)
	require.EqualValues(t, 7, g.b.balance(t, 3), "applied on purpose")
	require.Equal(t, 1, g.expiredCount(), "and reported")
	select {
	case <-g.dead.copies:
		t.Fatal("an allowed expired message must not be poisoned")
	default:
	}
}

func TestExpiryGuardErrorsWithoutPoison(t *testing.T) {
	t.Parallel()
	eventTime, err := framework.ParseTimeSpec("metadata:event_time")
	require.NoError(t, err)
	ran := false
	h := func(*message.Message) ([]*message.Message, error) { ran = true; return nil, nil }
	guard := middleware.ExpiryGuard{EventTime: eventTime} // default 30 days, real clock
	msg := message.NewMessage("1", nil)
	msg.Metadata.Set("event_time", time.Now().AddDate(0, 0, -31).Format(time.RFC3339))
	_, err = testenv.Install(t, middleware.NewExpiryGuard, guard)(h)(msg)
	require.ErrorAs(t, err, new(*framework.ExpiredError))
	require.True(t, framework.IsPermanent(err))
	require.False(t, ran)
	msg.Metadata.Set("event_time", time.Now().AddDate(0, 0, -29).Format(time.RFC3339))
	_, err = testenv.Install(t, middleware.NewExpiryGuard, guard)(h)(msg)
	require.NoError(t, err)
	require.True(t, ran)
	msg.Metadata.Set("event_time", "garbage")
	_, err = testenv.Install(t, middleware.NewExpiryGuard, guard)(h)(msg)
	require.ErrorAs(t, err, new(*framework.EventTimeError))
	require.True(t, framework.IsPermanent(err))

	var ce *framework.ConfigError
	require.ErrorAs(t, configErr(middleware.NewExpiryGuard, middleware.ExpiryGuard{}), &ce)
	require.Equal(t, "EventTime", ce.Field)
	require.ErrorAs(t, configErr(middleware.NewExpiryGuard, middleware.ExpiryGuard{EventTime: eventTime, Retention: -1}), &ce)
	require.Equal(t, "Retention", ce.Field)
	mw, err := middleware.NewExpiryGuard(middleware.ExpiryGuard{})
	require.ErrorAs(t, err, &ce, "a broken guard must not be installable")
	require.Nil(t, mw)
}

// The kafka:timestamp spec reads the key the Kafka adapter writes
// (brokers/kafka's TestMetadataNames pins the adapter's side).
func TestKafkaTimestampKeyMatchesAdapter(t *testing.T) {
	t.Parallel()
	require.Equal(t, "kafka_timestamp", kafkarecord.KafkaTimestamp)
}

// With the claim table partitioned by event day, the middleware claims in
// the partition of the message's own event time, so a redelivery processed
// on another day still meets its twin.
func TestPartitionedClaimsByEventTime(t *testing.T) {
	t.Parallel()
	b := setup(t, 4)
	ctx := context.Background()
	_, err := b.store.EnablePartitioning(ctx, store.RetentionConfig{})
	require.NoError(t, err)
	rec := &outcomes{}
	c := b.claim(t, "loyalty", rec)
	c.EventTime, err = framework.ParseTimeSpec("metadata:event_time")
	require.NoError(t, err)
	c.Fingerprint = true
	h := testenv.Install(t, middleware.NewClaim, c)(consume(credit))

	// An event from two days ago, delivered now and redelivered later:
	// the processing time differs, the event day does not.
	eventTime := time.Now().UTC().Add(-48 * time.Hour).Format(time.RFC3339Nano)
	o := order{OrderID: 42, CustomerID: 4, TotalCents: 4200}
	for i := 0; i < 2; i++ {
		msg := newDelivery(t, o)
		msg.Metadata.Set("event_time", eventTime)
		_, err := h(msg)
		require.NoError(t, err)
	}
	require.Equal(t, 1, rec.count(framework.Applied))
	require.Equal(t, 1, rec.count(framework.Duplicate))
	require.Equal(t, int64(42), b.balance(t, 4))
	var day time.Time
	require.NoError(t, b.pool.QueryRow(ctx, "SELECT event_day FROM "+b.schema+".processed_messages").Scan(&day))
	require.Equal(t, pg.EventDay(time.Now().Add(-48*time.Hour)), day.UTC())

	// No event time: the message cannot be placed, permanently.
	_, err = h(newDelivery(t, order{OrderID: 43, CustomerID: 4, TotalCents: 100}))
	require.ErrorAs(t, err, new(*framework.EventTimeError))
	require.True(t, framework.IsPermanent(err))
}

// Routing claims by a time that each copy of a message gets anew (the
// Kafka record timestamp, the clock) can put a republished copy in another
// day's partition, where it meets no twin: NewClaim refuses it, whichever
// way it is read, unless AllowBrokerEventTime says the risk is accepted.
func TestBrokerEventTimeRefusedForPartitionRouting(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	spec := func(s string) framework.TimeFunc {
		f, err := framework.ParseTimeSpec(s)
		require.NoError(t, err)
		return f
	}
	kafkaTS := spec("kafka:timestamp")
	fallback := func(msg *message.Message) (time.Time, error) {
		if at, err := spec("metadata:event_time")(msg); err == nil {
			return at, nil
		}
		return kafkaTS(msg)
	}
	for name, f := range map[string]framework.TimeFunc{
		"kafka:timestamp":          kafkaTS,
		"metadata:kafka_timestamp": spec("metadata:kafka_timestamp"),
		"fallback to kafka":        fallback,
		"clock":                    func(*message.Message) (time.Time, error) { return time.Now(), nil },
	} {
		c := b.claim(t, "loyalty", nil)
		c.EventTime = f
		var ce *framework.ConfigError
		require.ErrorAs(t, configErr(middleware.NewClaim, c), &ce, name)
		require.Equal(t, "EventTime", ce.Field, name)
		require.Contains(t, ce.Reason, "applied twice", name)
		require.Contains(t, ce.Reason, "AllowBrokerEventTime", name)
		// The opt-in is the only way past it.
		c.AllowBrokerEventTime = true
		require.NoError(t, configErr(middleware.NewClaim, c), name)
	}
	for name, f := range map[string]framework.TimeFunc{
		"metadata:event_time": spec("metadata:event_time"),
		"json:occurred_at":    spec("json:occurred_at"),
		"panics on the probe": func(msg *message.Message) (time.Time, error) {
			_ = msg.Payload[0]
			return time.Time{}, nil
		},
	} {
		c := b.claim(t, "loyalty", nil)
		c.EventTime = f
		require.NoError(t, configErr(middleware.NewClaim, c), name)
	}
	// The natural-key mode routes nothing by event time.
	c := middleware.Claim{Store: b.store, Consumer: "loyalty", Mode: middleware.ModeNaturalKey, EventTime: kafkaTS}
	require.NoError(t, configErr(middleware.NewClaim, c))
}
