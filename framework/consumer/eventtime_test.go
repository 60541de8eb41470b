package consumer_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/framework/consumer"
	"github.com/claimtx/claimtx/internal/pg"
	"github.com/claimtx/claimtx/internal/testenv"
	"github.com/claimtx/claimtx/middleware"
	"github.com/claimtx/claimtx/store"
)

// With claims partitioned by event day and the event time read from the
// Kafka record timestamp, a consumed message republished through the
// project's publisher (as Poison and the outbox relay do: a Copy with its
// metadata) and consumed again is still a duplicate. Before the publisher
// kept the timestamp, the copy got today's, claimed in today's partition,
// met no twin and was applied a second time.
func TestRepublishedKafkaCopyIsDuplicateInPartitionedClaims(t *testing.T) {
	t.Parallel()
	pool, schema, ctx, cancel := effectsDB(t, 4, "event_id text NOT NULL")
	st, err := store.New(pool, store.Config{Schema: schema})
	require.NoError(t, err)
	require.NoError(t, st.Migrate(ctx))
	_, err = st.EnablePartitioning(ctx, store.RetentionConfig{})
	require.NoError(t, err)

	br := startKafka(t)
	topic := "orders-" + randHex()
	bcfg := fastKafka(br.Addrs(), "eventtime-"+randHex())

	// The producer's record timestamp is 50 hours old: another UTC day
	// than the republish's, whatever the time of day.
	eventAt := time.Now().Add(-50 * time.Hour).UTC().Truncate(time.Millisecond)
	cl := kafkaClient(t, br, kgo.AllowAutoTopicCreation())
	require.NoError(t, cl.ProduceSync(ctx, &kgo.Record{
		Topic: topic, Value: []byte(`{}`), Timestamp: eventAt,
		Headers: []kgo.RecordHeader{{Key: "event_id", Value: []byte("evt-1")}},
	}).FirstErr())

	eventTime, err := framework.ParseTimeSpec("kafka:timestamp")
	require.NoError(t, err)
	cfg := baseConfig("ts", topic, pool, schema, bcfg)
	cfg.Claim.EventTime = eventTime
	delivered := make(chan *message.Message, 2)
	handler := func(ctx context.Context, tx pgx.Tx, msg *message.Message) error {
		delivered <- msg.Copy()
		_, err := tx.Exec(ctx, "INSERT INTO effects VALUES ($1)", msg.Metadata.Get("event_id"))
		return err
	}

	// Routing partitions by the record timestamp needs the explicit opt-in.
	_, err = consumer.New(ctx, cfg, handler)
	ce := requireConfigError(t, err, "Claim.EventTime")
	require.Contains(t, ce.Reason, "AllowBrokerEventTime")

	rec := newRecorder()
	cfg.Claim.AllowBrokerEventTime = true
	cfg.OnOutcome = rec.on
	c, err := consumer.New(ctx, cfg, handler)
	require.NoError(t, err)
	defer c.Close()
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()

	var first *message.Message
	select {
	case first = <-delivered:
	case <-time.After(30 * time.Second):
		t.Fatal("the produced record was not consumed")
	}
	require.Eventually(t, func() bool { return rec.n(framework.Applied) == 1 }, 10*time.Second, 10*time.Millisecond, "%v", rec.snapshot())

	require.NoError(t, newPublisher(t, bcfg).Publish(topic, first.Copy()))

	require.Eventually(t, func() bool { return rec.n(framework.Duplicate) == 1 || rec.n(framework.Applied) > 1 },
		30*time.Second, 10*time.Millisecond, "the republished copy was not consumed: %v", rec.snapshot())
	require.Equal(t, 1, rec.n(framework.Applied), "the republished copy was applied again: %v", rec.snapshot())
	require.Equal(t, 1, rec.n(framework.Duplicate))
	effects := queryInt(t, pool, "SELECT count(*) FROM effects")
	require.Equal(t, 1, effects)
	var days []time.Time
	rows, err := pool.Query(ctx, "SELECT event_day FROM "+schema+".processed_messages")
	require.NoError(t, err)
	days, err = pgx.CollectRows(rows, pgx.RowTo[time.Time])
	require.NoError(t, err)
	require.Equal(t, []time.Time{pg.EventDay(eventAt)}, utc(days))

	cancel()
	if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
		require.NoError(t, err)
	}
}

// An unpartitioned table routes nothing by event time: the expiry guard
// alone may use the record timestamp without the opt-in (its weaker
// protection beats none; see Config.Claim).
func TestBrokerEventTimeForExpiryGuardOnly(t *testing.T) {
	t.Parallel()
	pool, schema := testenv.Setup(t, 2)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	eventTime, err := framework.ParseTimeSpec("kafka:timestamp")
	require.NoError(t, err)
	cfg := baseConfig("ts", "orders", pool, schema, goChannel(schema))
	cfg.Claim.EventTime, cfg.Retention = eventTime, 30*24*time.Hour
	done := runConsumer(t, ctx, cfg, noop)
	stopConsumer(t, cancel, done)
}

func utc(ts []time.Time) []time.Time {
	out := make([]time.Time, len(ts))
	for i, t := range ts {
		out[i] = t.UTC()
	}
	return out
}

// A replay of a 40-day-old event under 30-day retention is poisoned with
// outcome Expired and not applied; a current one is applied.
func TestExpiredReplayIsPoisoned(t *testing.T) {
	t.Parallel()
	pool, schema, ctx, cancel := effectsDB(t, 4, "k text NOT NULL")
	bcfg := goChannel(schema)
	eventTime, err := framework.ParseTimeSpec("metadata:event_time")
	require.NoError(t, err)
	rec := newRecorder()
	cfg := baseConfig("exp", "orders", pool, schema, bcfg)
	cfg.Claim.EventTime, cfg.Retention, cfg.OnOutcome = eventTime, 30*24*time.Hour, rec.on
	pub, poisoned := pubPoisoned(t, ctx, bcfg, "orders")
	done := runConsumer(t, ctx, cfg, insertEventID)

	old := testenv.Message(`{}`, "event_id", "old", "event_time", time.Now().Add(-40*24*time.Hour).UTC().Format(time.RFC3339))
	fresh := testenv.Message(`{}`, "event_id", "fresh", "event_time", time.Now().UTC().Format(time.RFC3339))
	require.NoError(t, pub.Publish("orders", old, fresh))

	m := awaitPoisoned(t, poisoned, 10*time.Second, "expired message not poisoned")
	require.Equal(t, "old", m.Metadata.Get("event_id"))
	require.Contains(t, m.Metadata.Get(middleware.PoisonReasonKey), "expired")
	require.Eventually(t, func() bool { return rec.n(framework.Applied) == 1 && rec.n(framework.Expired) == 1 }, 10*time.Second, 10*time.Millisecond, "%v", rec.snapshot())
	require.Zero(t, rec.n(framework.Poisoned))
	var keys []string
	rows, err := pool.Query(ctx, "SELECT k FROM effects")
	require.NoError(t, err)
	keys, err = pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{"fresh"}, keys)
	stopConsumer(t, cancel, done)
}
