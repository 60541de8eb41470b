package kafka_test

import (
	"context"
	"math"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/tests"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/claimtx/claimtx/brokers"
	"github.com/claimtx/claimtx/brokers/kafka"
	"github.com/claimtx/claimtx/brokers/kafka/kafkatest"
	"github.com/claimtx/claimtx/internal/kafkarecord"
	"github.com/claimtx/claimtx/internal/testenv"
)

func TestMain(m *testing.M) {
	testenv.VerifyTestMain(m)
}

// uniqueName returns a topic/group name unique to this test and run.
func uniqueName(t *testing.T) string { return testenv.UniqueName(t, 80) }

// startBroker starts a dev broker on a free port for one test.
func startBroker(t *testing.T) *kafkatest.Broker {
	t.Helper()
	b, err := kafkatest.Start(t.Context(), kafkatest.Options{Addr: "127.0.0.1:0", Partitions: 4})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, b.Close()) })
	return b
}

// testConfig is a Kafka config with short group timings against b.
func testConfig(t *testing.T, b *kafkatest.Broker) brokers.KafkaConfig {
	return brokers.KafkaConfig{
		Brokers:           b.Addrs(),
		ConsumerGroup:     uniqueName(t),
		SessionTimeout:    2 * time.Second,
		HeartbeatInterval: 100 * time.Millisecond,
		RebalanceTimeout:  3 * time.Second,
		CommitInterval:    100 * time.Millisecond,
		NackDelay:         10 * time.Millisecond,
		DialTimeout:       5 * time.Second,
		ReconnectBackoff:  100 * time.Millisecond,
	}
}

// publish publishes msgs to topic in order with a publisher of its own.
func publish(t *testing.T, cfg brokers.KafkaConfig, topic string, msgs ...*message.Message) {
	t.Helper()
	pub, err := kafka.NewPublisher(context.Background(), cfg, nil)
	require.NoError(t, err)
	defer func() { require.NoError(t, pub.Close()) }()
	require.NoError(t, pub.Publish(topic, msgs...))
}

// keyedMessage is a message with an event_id and a partition key, as a
// producer of entity events sends it.
func keyedMessage(uuid, eventID, key string) *message.Message {
	m := message.NewMessage(uuid, []byte("body"))
	m.Metadata.Set("event_id", eventID)
	m.Metadata.Set(kafka.PartitionKeyMetadata, key)
	return m
}

// receive waits for one message or fails the test.
func receive(t *testing.T, ch <-chan *message.Message, timeout time.Duration) *message.Message {
	t.Helper()
	return testenv.Receive(t, ch, timeout)
}

// TestPubSubConformance runs Watermill's Pub/Sub suite against the Kafka
// adapter and the dev broker. Consumer groups are supported; order is not
// guaranteed across partitions (topics have 4 here); messages persist.
// ForceShort keeps the suite's 5000-message variants out: every consumer
// group join on 2 cores costs a rebalance, and the long form takes minutes.
// TestReconnect needs a broker restart command and is skipped by the suite.
func TestPubSubConformance(t *testing.T) {
	t.Parallel()
	runConformance(t, 0)
}

// TestPubSubConformanceWindow runs the same suite in window mode (see
// brokers.KafkaConfig.Window). Its TestNoAck (no second message before the first is
// acked) is skipped because order is not guaranteed across partitions.
func TestPubSubConformanceWindow(t *testing.T) {
	t.Parallel()
	runConformance(t, 16)
}

func runConformance(t *testing.T, window int) {
	cfg := testConfig(t, startBroker(t))
	cfg.Window = window
	group := cfg.ConsumerGroup
	logger := watermill.NopLogger{}

	closeAtEnd := testenv.CloseAtEnd(t)
	build := func(t *testing.T, group string) (message.Publisher, message.Subscriber) {
		c := cfg
		c.ConsumerGroup = group
		pub, err := kafka.NewPublisher(context.Background(), c, logger)
		require.NoError(t, err)
		sub, err := kafka.NewSubscriber(context.Background(), c, logger)
		require.NoError(t, err)
		closeAtEnd(pub, sub)
		return pub, sub
	}
	tests.TestPubSub(t,
		tests.Features{
			ConsumerGroups:      true,
			ExactlyOnceDelivery: false,
			GuaranteedOrder:     false,
			Persistent:          true,
			ForceShort:          testing.Short(),
		},
		func(t *testing.T) (message.Publisher, message.Subscriber) { return build(t, group) },
		build,
	)
}

// TestPlainProducer: a franz-go producer that knows nothing of Watermill
// (no UUID header) with an event_id header and a key.
func TestPlainProducer(t *testing.T) {
	t.Parallel()
	b := startBroker(t)
	cfg := testConfig(t, b)
	topic := uniqueName(t)

	cl, err := kgo.NewClient(kgo.SeedBrokers(b.Addrs()...), kgo.AllowAutoTopicCreation())
	require.NoError(t, err)
	defer cl.Close()
	ts := time.Date(2024, 2, 3, 4, 5, 6, 7_000_000, time.UTC)
	res := cl.ProduceSync(t.Context(), &kgo.Record{
		Topic:     topic,
		Key:       []byte("order-7"),
		Value:     []byte(`{"order_id":"order-7"}`),
		Timestamp: ts,
		Headers:   []kgo.RecordHeader{{Key: "event_id", Value: []byte("evt-7")}},
	})
	require.NoError(t, res.FirstErr())
	rec := res[0].Record

	sub, msgs := subscribe(t, cfg, topic)
	defer closeSub(t, sub)
	m := receive(t, msgs, 15*time.Second)
	require.True(t, m.Ack())

	require.NotEmpty(t, m.UUID)
	require.Equal(t, `{"order_id":"order-7"}`, string(m.Payload))
	require.Equal(t, "evt-7", m.Metadata.Get("event_id"))
	require.Equal(t, "order-7", m.Metadata.Get(kafkarecord.KafkaKey))
	require.Equal(t, topic, m.Metadata.Get(kafkarecord.KafkaTopic))
	require.Equal(t, strconv.Itoa(int(rec.Partition)), m.Metadata.Get(kafkarecord.KafkaPartition))
	require.Equal(t, strconv.FormatInt(rec.Offset, 10), m.Metadata.Get(kafkarecord.KafkaOffset))
	require.Equal(t, "2024-02-03T04:05:06.007Z", m.Metadata.Get(kafkarecord.KafkaTimestamp))
}

// TestRepublishKeepsTimestamp: a record with a producer-set timestamp,
// consumed and republished through the adapter's publisher as Poison and
// the outbox relay do (a Copy with its metadata), arrives with the same
// timestamp, so an event time read from it ("kafka:timestamp") does not
// move to the day of the republish.
func TestRepublishKeepsTimestamp(t *testing.T) {
	t.Parallel()
	b := startBroker(t)
	cfg := testConfig(t, b)
	topic, again := uniqueName(t), uniqueName(t)

	cl, err := kgo.NewClient(kgo.SeedBrokers(b.Addrs()...), kgo.AllowAutoTopicCreation())
	require.NoError(t, err)
	defer cl.Close()
	ts := time.Date(2024, 2, 3, 4, 5, 6, 7_000_000, time.UTC)
	require.NoError(t, cl.ProduceSync(t.Context(), &kgo.Record{
		Topic: topic, Value: []byte("body"), Timestamp: ts,
		Headers: []kgo.RecordHeader{{Key: "event_id", Value: []byte("evt-ts")}},
	}).FirstErr())

	sub, msgs := subscribe(t, cfg, topic)
	defer closeSub(t, sub)
	first := receive(t, msgs, 15*time.Second)
	require.True(t, first.Ack())
	require.Equal(t, "2024-02-03T04:05:06.007Z", first.Metadata.Get(kafkarecord.KafkaTimestamp))

	publish(t, cfg, again, first.Copy())
	sub2, msgs2 := subscribe(t, cfg, again)
	defer closeSub(t, sub2)
	copied := receive(t, msgs2, 15*time.Second)
	require.True(t, copied.Ack())
	require.Equal(t, "evt-ts", copied.Metadata.Get("event_id"))
	require.Equal(t, again, copied.Metadata.Get(kafkarecord.KafkaTopic))
	require.Equal(t, first.Metadata.Get(kafkarecord.KafkaTimestamp), copied.Metadata.Get(kafkarecord.KafkaTimestamp))
}

// TestGroupStartsFromOldest: a consumer group with no committed offset
// reads what was produced before it existed.
func TestGroupStartsFromOldest(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t, startBroker(t))
	topic := uniqueName(t)

	want := map[string]bool{}
	var sent []*message.Message
	for i := range 5 {
		m := message.NewMessage(watermill.NewUUID(), []byte(strconv.Itoa(i)))
		want[m.UUID] = true
		sent = append(sent, m)
	}
	publish(t, cfg, topic, sent...)

	sub, msgs := subscribe(t, cfg, topic)
	defer closeSub(t, sub)
	got := map[string]bool{}
	for len(got) < len(want) {
		m := receive(t, msgs, 15*time.Second)
		got[m.UUID] = true
		m.Ack()
	}
	require.Equal(t, want, got)
}

// TestRoundTripMetadata: what the publisher sends is what the subscriber
// gets, plus the kafka_* keys; partition_key becomes the record key.
func TestRoundTripMetadata(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t, startBroker(t))
	topic := uniqueName(t)

	sent := keyedMessage("uuid-rt", "evt-rt", "customer-1")
	sent.Metadata.Set(kafkarecord.KafkaOffset, "999") // stale delivery metadata is not published
	before := time.Now().Add(-time.Second)
	publish(t, cfg, topic, sent)

	sub, msgs := subscribe(t, cfg, topic)
	defer closeSub(t, sub)
	m := receive(t, msgs, 15*time.Second)
	require.True(t, m.Ack())

	require.Equal(t, "uuid-rt", m.UUID)
	require.Equal(t, "body", string(m.Payload))
	require.Equal(t, "evt-rt", m.Metadata.Get("event_id"))
	require.Equal(t, "customer-1", m.Metadata.Get(kafka.PartitionKeyMetadata))
	require.Equal(t, "customer-1", m.Metadata.Get(kafkarecord.KafkaKey))
	require.Equal(t, "0", m.Metadata.Get(kafkarecord.KafkaOffset))
	ts, err := time.Parse(time.RFC3339Nano, m.Metadata.Get(kafkarecord.KafkaTimestamp))
	require.NoError(t, err)
	require.True(t, ts.After(before), "record timestamp %s", ts)
	require.Len(t, m.Metadata, 7)
}

// TestNackResends: a nacked message comes back (from memory, same offset)
// after NackDelay.
func TestNackResends(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t, startBroker(t))
	cfg.NackDelay = 300 * time.Millisecond
	topic := uniqueName(t)

	publish(t, cfg, topic, message.NewMessage("n-1", []byte("x")))

	sub, msgs := subscribe(t, cfg, topic)
	defer closeSub(t, sub)
	first := receive(t, msgs, 15*time.Second)
	nackedAt := time.Now()
	first.Nack()
	again := receive(t, msgs, 15*time.Second)
	require.GreaterOrEqual(t, time.Since(nackedAt), cfg.NackDelay)
	require.Equal(t, "n-1", again.UUID)
	require.Equal(t, first.Metadata.Get(kafkarecord.KafkaOffset), again.Metadata.Get(kafkarecord.KafkaOffset))
	again.Ack()
}

// TestSASL: SCRAM and PLAIN credentials reach the broker through Sarama.
func TestSASL(t *testing.T) {
	t.Parallel()
	for _, mech := range []string{"PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"} {
		t.Run(mech, func(t *testing.T) {
			t.Parallel()
			c, err := kfake.NewCluster(
				kfake.NumBrokers(1),
				kfake.EnableSASL(),
				kfake.Superuser(mech, "app", "app-secret"),
				kfake.AllowAutoTopicCreation(),
			)
			require.NoError(t, err)
			defer c.Close()

			cfg := brokers.KafkaConfig{
				Brokers:     c.ListenAddrs(),
				DialTimeout: -1,
				SASL:        brokers.KafkaSASLConfig{Mechanism: mech, User: "app", Password: "app-secret"},
			}
			pub, err := kafka.NewPublisher(context.Background(), cfg, nil)
			require.NoError(t, err)
			require.NoError(t, pub.Publish(uniqueName(t), message.NewMessage("s", nil)))
			require.NoError(t, pub.Close())

			cfg.SASL.Password = "wrong-secret"
			_, err = kafka.NewPublisher(context.Background(), cfg, nil)
			require.Error(t, err)
			require.NotContains(t, err.Error(), "wrong-secret")
		})
	}
}

// TestDialRetry: with no broker, start-up retries until DialTimeout.
func TestDialRetry(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())

	cfg := brokers.KafkaConfig{Brokers: []string{addr}, ConsumerGroup: "g", DialTimeout: 800 * time.Millisecond, ReconnectBackoff: 100 * time.Millisecond}
	start := time.Now()
	_, err = kafka.NewPublisher(context.Background(), cfg, nil)
	require.Error(t, err)
	require.GreaterOrEqual(t, time.Since(start), cfg.DialTimeout)
	require.Contains(t, err.Error(), "gave up after")
	require.ErrorIs(t, err, sarama.ErrOutOfBrokers)

	sub, err := kafka.NewSubscriber(context.Background(), cfg, nil)
	require.NoError(t, err, "NewSubscriber does not connect")
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	_, err = sub.Subscribe(ctx, "t")
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.NoError(t, sub.Close())
}

// TestSubscribeAfterClose fails at once instead of retrying.
func TestSubscribeAfterClose(t *testing.T) {
	t.Parallel()
	sub, err := kafka.NewSubscriber(context.Background(), brokers.KafkaConfig{ConsumerGroup: "g", DialTimeout: time.Minute}, nil)
	require.NoError(t, err)
	require.NoError(t, sub.Close())
	start := time.Now()
	_, err = sub.Subscribe(t.Context(), "t")
	require.ErrorContains(t, err, "closed")
	require.Less(t, time.Since(start), time.Second)
}

// ReplayHorizon reads what the broker will keep: a topic's retention.ms,
// unbounded for -1 and for compacted topics.
func TestReplayHorizon(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	br, err := kafkatest.Start(ctx, kafkatest.Options{Addr: "127.0.0.1:0", DisableAutoCreateTopics: true})
	require.NoError(t, err)
	t.Cleanup(func() { _ = br.Close() })
	adm := newAdmin(t, br)
	str := func(s string) *string { return &s }
	for name, cfg := range map[string]map[string]*string{
		"day":     {"retention.ms": str("86400000")},
		"forever": {"retention.ms": str("-1")},
		"compact": {"cleanup.policy": str("compact")},
	} {
		_, err := adm.CreateTopic(ctx, 1, 1, cfg, name)
		require.NoError(t, err)
	}
	s, err := kafka.NewSubscriber(ctx, brokers.KafkaConfig{Brokers: br.Addrs(), ConsumerGroup: "horizon"}, nil)
	require.NoError(t, err)
	sub := s.(*kafka.Subscriber)
	t.Cleanup(func() { _ = sub.Close() })

	for topic, want := range map[string]time.Duration{
		"day":     24 * time.Hour,
		"forever": math.MaxInt64,
		"compact": math.MaxInt64,
	} {
		got, err := sub.ReplayHorizon(ctx, topic)
		require.NoError(t, err, topic)
		require.Equal(t, want, got, topic)
	}
	// A topic not created yet gets the broker's default.
	got, err := sub.ReplayHorizon(ctx, "not-yet")
	require.NoError(t, err)
	require.Positive(t, got)

	cctx, cancel := context.WithCancel(ctx)
	cancel()
	_, err = sub.ReplayHorizon(cctx, "day")
	require.ErrorIs(t, err, context.Canceled)
}
