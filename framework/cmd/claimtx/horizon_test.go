package main

import (
	"encoding/json"
	"log/slog"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/claimtx/claimtx/brokers/kafka/kafkatest"
)

// `claimtx stats --topic T --retention D` puts the consumer's claim
// retention beside the broker's replay horizon, as the running consumer
// logs it, and says which is longer.
func TestCLIStatsRetentionHorizon(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	br, err := kafkatest.Start(ctx, kafkatest.Options{Addr: "127.0.0.1:0", Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	t.Cleanup(func() { _ = br.Close() })
	cl, err := kgo.NewClient(kgo.SeedBrokers(br.Addrs()...))
	require.NoError(t, err)
	defer cl.Close()
	day := "86400000"
	for _, name := range []string{"orders", "orders.poison"} {
		_, err := kadm.NewClient(cl).CreateTopic(ctx, 1, 1, map[string]*string{"retention.ms": &day}, name)
		require.NoError(t, err)
	}

	c := migratedCLI(t)
	// The broker flags stand for BROKER and KAFKA_BROKERS, which the
	// command reads from the process environment.
	kafka := []string{"--broker", "kafka", "--kafka-brokers", br.Addrs()[0]}

	out := c.ok(append([]string{"stats", "--topic", "orders", "--retention", "12h"}, kafka...)...)
	require.Contains(t, out, "retention 12h, replay horizon 1d (orders, orders.poison): WARNING")
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
}
