package claimtxcli

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/claimtx/claimtx/brokers/kafka/kafkatest"
	"github.com/claimtx/claimtx/framework/cmd/claimtx/internal/dlq/dlqtest"
)

// startKafka starts a Kafka-protocol broker of the test's own with
// topics of partitions each, created with configs, and returns its
// address and a client of it, which produces to the partition a record
// names.
func startKafka(t *testing.T, partitions int32, configs map[string]*string, topics ...string) (string, *kgo.Client) {
	t.Helper()
	br, err := kafkatest.Start(t.Context(), kafkatest.Options{Addr: "127.0.0.1:0", Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	t.Cleanup(func() { _ = br.Close() })
	cl, err := kgo.NewClient(kgo.SeedBrokers(br.Addrs()...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	require.NoError(t, err)
	t.Cleanup(cl.Close)
	for _, topic := range topics {
		_, err := kadm.NewClient(cl).CreateTopic(t.Context(), partitions, 1, configs, topic)
		require.NoError(t, err)
	}
	return br.Addrs()[0], cl
}

// `claimtx stats --topic T --retention D` puts the consumer's claim
// retention beside the broker's replay horizon, as the running consumer
// logs it, and says which is longer.
func TestCLIStatsRetentionHorizon(t *testing.T) {
	t.Parallel()
	day := "86400000"
	addr, _ := startKafka(t, 1, map[string]*string{"retention.ms": &day}, "orders", "orders.poison")

	c := migratedCLI(t)
	// The broker flags stand for BROKER and KAFKA_BROKERS, which the
	// command reads from the process environment.
	kafka := []string{"--broker", "kafka", "--kafka-brokers", addr}

	out := c.ok(append([]string{"stats", "--topic", "orders", "--retention", "12h"}, kafka...)...)
	require.Contains(t, out, "retention 12h, replay horizon 1d (orders, orders.poison): WARNING")
	// stats cannot know whether the consumer has an expiry guard: it does
	// not say the guard poisons the message, only what happens with and
	// without one.
	require.NotContains(t, out, "the expiry guard poisons")
	require.Contains(t, out, "a consumer without an expiry guard applies it again, one with a guard (consumer.Config.Retention with an event time) poisons it as expired")
	out = c.ok(append([]string{"stats", "--topic", "orders", "--retention", "2d"}, kafka...)...)
	require.Contains(t, out, "retention 2d, replay horizon 1d (orders, orders.poison): OK")

	var js struct {
		Claims  int64
		Horizon struct {
			Exceeded bool `json:"horizon_exceeds_retention"`
		} `json:"retention_horizon"`
	}
	require.NoError(t, json.Unmarshal([]byte(c.ok(append([]string{"stats", "--json", "--topic", "orders", "--retention", "12h"}, kafka...)...)), &js))
	require.True(t, js.Horizon.Exceeded)

	// One without the other is a usage error.
	code, _, errOut := c.run("stats", "--topic", "orders")
	require.Equal(t, exitUsage, code, errOut)

	// RabbitMQ keeps a message until it is acked: unbounded.
	out = c.ok("stats", "--topic", "orders-"+c.schema, "--retention", "30d", "--broker", "amqp")
	require.Contains(t, out, "replay horizon unbounded")
	require.Contains(t, out, "WARNING")

	// NATS: the max_age of the streams that keep the subjects.
	topic := "orders-" + c.schema
	nc, err := natsgo.Connect(dlqtest.NATSURL)
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	jsc, err := jetstream.New(nc)
	require.NoError(t, err)
	for _, subj := range []string{topic, topic + ".poison"} {
		name := strings.ReplaceAll(subj, ".", "_")
		_, err = jsc.CreateStream(t.Context(), jetstream.StreamConfig{Name: name, Subjects: []string{subj}, MaxAge: 24 * time.Hour})
		require.NoError(t, err)
		t.Cleanup(func() { _ = jsc.DeleteStream(context.Background(), name) })
	}
	out = c.ok("stats", "--topic", topic, "--retention", "12h", "--broker", "nats")
	require.Contains(t, out, fmt.Sprintf("retention 12h, replay horizon 1d (%s, %s.poison): WARNING", topic, topic))
}

// TestCLIStatsKafkaPositions: `claimtx stats` lists the stored Kafka
// positions and, with the Kafka broker named, each partition's end offset
// and lag (records past the stored position).
func TestCLIStatsKafkaPositions(t *testing.T) {
	t.Parallel()
	c := migratedCLI(t)
	// The records go to partition 0 (startKafka's client partitions
	// manually: the default partitioner would spread them).
	addr, cl := startKafka(t, 2, nil, "orders")
	for range 7 {
		require.NoError(t, cl.ProduceSync(context.Background(), &kgo.Record{Topic: "orders", Partition: 0, Value: []byte("x")}).FirstErr())
	}
	c.exec(`INSERT INTO ` + pgx.Identifier{c.schema, "kafka_positions"}.Sanitize() + ` (consumer, topic, partition, settled_below)
VALUES ('loyalty', 'orders', 0, 5), ('loyalty', 'orders', 1, 0)`)

	out := c.ok("stats")
	require.Contains(t, out, "kafka positions stored with the claims")
	require.Regexp(t, `loyalty\s+orders\s+0\s+5\s+\?\s+\?`, out)
	require.Contains(t, out, "lag unknown")

	kafkaFlags := []string{"--broker", "kafka", "--kafka-brokers", addr}
	out = c.ok(append([]string{"stats"}, kafkaFlags...)...)
	require.Regexp(t, `loyalty\s+orders\s+0\s+5\s+7\s+2\s`, out)
	require.Regexp(t, `loyalty\s+orders\s+1\s+0\s+0\s+0\s`, out)

	var js struct {
		KafkaPositions []struct{ Topic string }
		Lags           []struct {
			Lag *int64 `json:"lag"`
		} `json:"kafka_position_lags"`
	}
	require.NoError(t, json.Unmarshal([]byte(c.ok(append([]string{"stats", "--json"}, kafkaFlags...)...)), &js))
	require.Len(t, js.KafkaPositions, 2)
	require.Len(t, js.Lags, 2)
	require.EqualValues(t, 2, *js.Lags[0].Lag)
}
