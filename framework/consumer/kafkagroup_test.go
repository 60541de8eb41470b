package consumer_test

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/claimtx/claimtx/brokers"
	_ "github.com/claimtx/claimtx/brokers/kafka" // registers the kind
	"github.com/claimtx/claimtx/brokers/kafka/kafkatest"
	"github.com/claimtx/claimtx/framework/consumer"
	"github.com/claimtx/claimtx/internal/testenv"
	"github.com/claimtx/claimtx/store"
)

// TestKafkaDefaultGroupPerConsumer is the usual fan-out: two services
// (different consumer names) read the same topic, neither sets a consumer
// group. Each must see every message. A shared default group would make
// them split the partitions, each missing the other's half.
func TestKafkaDefaultGroupPerConsumer(t *testing.T) {
	t.Parallel()
	pool, schema := testenv.Setup(t, 8)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	br, err := kafkatest.Start(t.Context(), kafkatest.Options{Addr: "127.0.0.1:0", Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	t.Cleanup(func() { _ = br.Close() })
	topic := "fanout-" + randHex()
	cl, err := kgo.NewClient(kgo.SeedBrokers(br.Addrs()...), kgo.ProducerLinger(0))
	require.NoError(t, err)
	defer cl.Close()
	// Two partitions, so a shared group has something to split.
	_, err = kadm.NewClient(cl).CreateTopic(ctx, 2, 1, nil, topic)
	require.NoError(t, err)
	const n = 20
	for i := range n {
		require.NoError(t, cl.ProduceSync(ctx, &kgo.Record{
			Topic: topic, Key: fmt.Appendf(nil, "k%d", i), Value: []byte(`{}`),
			Headers: []kgo.RecordHeader{{Key: "event_id", Value: fmt.Appendf(nil, "evt-%d", i)}},
		}).FirstErr())
	}

	// No ConsumerGroup: the defaults, as brokers.LoadConfig("") gives them
	// without KAFKA_CONSUMER_GROUP.
	bcfg := brokers.Config{Kind: brokers.KindKafka, Kafka: brokers.KafkaConfig{
		Brokers:        br.Addrs(),
		SessionTimeout: 2 * time.Second, HeartbeatInterval: 100 * time.Millisecond,
		RebalanceTimeout: 3 * time.Second, CommitInterval: 100 * time.Millisecond,
		NackDelay: 10 * time.Millisecond,
	}}
	type seen struct {
		sync.Mutex
		ids map[string]bool
	}
	names := []string{"loyalty", "analytics"}
	got := map[string]*seen{}
	done := make(chan error, len(names))
	for _, name := range names {
		s := &seen{ids: map[string]bool{}}
		got[name] = s
		c, err := consumer.New(ctx, consumer.Config{
			Name: name, Topic: topic, Key: "metadata:event_id", Pool: pool,
			Store: store.Config{Schema: schema}, Broker: bcfg, Logger: slog.New(slog.DiscardHandler),
		}, func(_ context.Context, _ pgx.Tx, msg *message.Message) error {
			s.Lock()
			defer s.Unlock()
			s.ids[msg.Metadata.Get("event_id")] = true
			return nil
		})
		require.NoError(t, err)
		defer c.Close()
		go func() { done <- c.Run(ctx) }()
	}
	count := func(name string) int {
		s := got[name]
		s.Lock()
		defer s.Unlock()
		return len(s.ids)
	}
	require.Eventually(t, func() bool { return count("loyalty") == n && count("analytics") == n },
		30*time.Second, 50*time.Millisecond, "each consumer sees all %d messages", n)
	// Stay a little longer: a shared group rebalancing late would show here.
	time.Sleep(500 * time.Millisecond)
	require.Equal(t, n, count("loyalty"))
	require.Equal(t, n, count("analytics"))
	cancel()
	for range names {
		require.NoError(t, <-done)
	}
}
