package middleware_test

import (
	"context"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/internal/pg"
	"github.com/claimtx/claimtx/middleware"
	"github.com/claimtx/claimtx/store"
)

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
	h := install(t, middleware.NewClaim, c)(consume(credit))

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
