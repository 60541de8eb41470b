package consumer_test

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/claimtx/claimtx/brokers"
	_ "github.com/claimtx/claimtx/brokers/kafka" // registers the kind
	"github.com/claimtx/claimtx/brokers/kafka/kafkatest"
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

	br, err := kafkatest.Start(t.Context(), kafkatest.Options{Addr: "127.0.0.1:0", Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	t.Cleanup(func() { _ = br.Close() })
	topic := "orders-" + randHex()
	bcfg := brokers.Config{Kind: brokers.KindKafka, Kafka: brokers.KafkaConfig{
		Brokers: br.Addrs(), ConsumerGroup: "eventtime-" + randHex(),
		SessionTimeout: 2 * time.Second, HeartbeatInterval: 100 * time.Millisecond,
		RebalanceTimeout: 3 * time.Second, CommitInterval: 100 * time.Millisecond,
		NackDelay: 10 * time.Millisecond,
	}}

	// The producer's record timestamp is 50 hours old: another UTC day
	// than the republish's, whatever the time of day.
	eventAt := time.Now().Add(-50 * time.Hour).UTC().Truncate(time.Millisecond)
	cl, err := kgo.NewClient(kgo.SeedBrokers(br.Addrs()...), kgo.AllowAutoTopicCreation())
	require.NoError(t, err)
	defer cl.Close()
	require.NoError(t, cl.ProduceSync(ctx, &kgo.Record{
		Topic: topic, Value: []byte(`{}`), Timestamp: eventAt,
		Headers: []kgo.RecordHeader{{Key: "event_id", Value: []byte("evt-1")}},
	}).FirstErr())

	eventTime, err := framework.ParseTimeSpec("kafka:timestamp")
	require.NoError(t, err)
	cfg := consumer.Config{
		Name: "ts", Topic: topic, Key: "metadata:event_id", Pool: pool, Store: store.Config{Schema: schema},
		Broker: bcfg, Claim: middleware.Claim{EventTime: eventTime}, Logger: slog.New(slog.DiscardHandler),
	}
	delivered := make(chan *message.Message, 2)
	handler := func(ctx context.Context, tx pgx.Tx, msg *message.Message) error {
		delivered <- msg.Copy()
		_, err := tx.Exec(ctx, "INSERT INTO effects VALUES ($1)", msg.Metadata.Get("event_id"))
		return err
	}

	// Routing partitions by the record timestamp needs the explicit opt-in.
	_, err = consumer.New(ctx, cfg, handler)
	var ce *framework.ConfigError
	require.ErrorAs(t, err, &ce)
	require.Equal(t, "Claim.EventTime", ce.Field)
	require.Contains(t, ce.Reason, "AllowBrokerEventTime")

	rec := &recorder{got: map[framework.Outcome]int{}}
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

	pub, err := brokers.NewPublisher(bcfg, watermill.NopLogger{})
	require.NoError(t, err)
	defer pub.Close()
	require.NoError(t, pub.Publish(topic, first.Copy()))

	require.Eventually(t, func() bool { return rec.n(framework.Duplicate) == 1 || rec.n(framework.Applied) > 1 },
		30*time.Second, 10*time.Millisecond, "the republished copy was not consumed: %v", rec.snapshot())
	require.Equal(t, 1, rec.n(framework.Applied), "the republished copy was applied again: %v", rec.snapshot())
	require.Equal(t, 1, rec.n(framework.Duplicate))
	var effects int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM effects").Scan(&effects))
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
	c, err := consumer.New(ctx, consumer.Config{
		Name: "ts", Topic: "orders", Key: "metadata:event_id", Pool: pool, Store: store.Config{Schema: schema},
		Broker: goChannel(schema), Claim: middleware.Claim{EventTime: eventTime}, Retention: 30 * 24 * time.Hour,
		Logger: slog.New(slog.DiscardHandler),
	}, func(context.Context, pgx.Tx, *message.Message) error { return nil })
	require.NoError(t, err)
	defer c.Close()
	done := runUntilCancel(ctx, c)
	cancel()
	require.NoError(t, <-done)
}

func utc(ts []time.Time) []time.Time {
	out := make([]time.Time, len(ts))
	for i, t := range ts {
		out[i] = t.UTC()
	}
	return out
}
