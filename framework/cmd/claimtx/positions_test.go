package main

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/claimtx/claimtx/brokers/kafka/kafkatest"
)

// TestCLIStatsKafkaPositions: `claimtx stats` lists the stored Kafka
// positions and, with the Kafka broker named, each partition's end offset
// and lag (records past the stored position).
func TestCLIStatsKafkaPositions(t *testing.T) {
	t.Parallel()
	c := migratedCLI(t)
	br, err := kafkatest.Start(t.Context(), kafkatest.Options{Addr: "127.0.0.1:0"})
	require.NoError(t, err)
	t.Cleanup(func() { _ = br.Close() })
	// The records go to partition 0: the default partitioner would
	// spread them.
	cl, err := kgo.NewClient(kgo.SeedBrokers(br.Addrs()...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	require.NoError(t, err)
	defer cl.Close()
	_, err = kadm.NewClient(cl).CreateTopic(context.Background(), 2, 1, nil, "orders")
	require.NoError(t, err)
	for range 7 {
		require.NoError(t, cl.ProduceSync(context.Background(), &kgo.Record{Topic: "orders", Partition: 0, Value: []byte("x")}).FirstErr())
	}
	c.exec(`INSERT INTO ` + pgx.Identifier{c.schema, "kafka_positions"}.Sanitize() + ` (consumer, topic, partition, settled_below)
VALUES ('loyalty', 'orders', 0, 5), ('loyalty', 'orders', 1, 0)`)

	out := c.ok("stats")
	require.Contains(t, out, "kafka positions stored with the claims")
	require.Regexp(t, `loyalty\s+orders\s+0\s+5\s+\?\s+\?`, out)
	require.Contains(t, out, "lag unknown")

	kafkaFlags := []string{"--broker", "kafka", "--kafka-brokers", br.Addrs()[0]}
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
