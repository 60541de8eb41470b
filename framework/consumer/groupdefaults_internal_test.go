package consumer

import (
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/brokers"
)

// TestGroupDefaults: group commit gives RabbitMQ the window it needs, and
// nothing else: not a window the user set, not Kafka (its order), not
// without group commit; and Kafka with one record in flight per partition,
// where groups cannot win, commits per message unless MaxGroup is set.
func TestGroupDefaults(t *testing.T) {
	kafka := func(c *Config) { c.Broker.Kind = brokers.KindKafka }
	for _, tc := range []struct {
		name       string
		edit       func(*Config)
		wantWindow int
		wantGroup  int // Claim.MaxGroup as New passes it on; 0: the middleware's default
	}{
		{"default: 4 x 16", func(*Config) {}, 64, 0},
		{"concurrency 3, group 8", func(c *Config) { c.Broker.AMQP.Concurrency, c.Claim.MaxGroup = 3, 8 }, 24, 8},
		{"capped at the AMQP prefetch limit", func(c *Config) { c.Broker.AMQP.Concurrency, c.Claim.MaxGroup = 1024, 64 }, maxAMQPWindow, 64},
		{"the user's window stays", func(c *Config) { c.Broker.AMQP.Window = 5 }, 5, 0},
		{"MaxGroup 1: none", func(c *Config) { c.Claim.MaxGroup = 1 }, 0, 1},
		{"SERIALIZABLE: none", func(c *Config) { c.Claim.Isolation = pgx.Serializable }, 0, 0},
		{"ordered: none", func(c *Config) { c.OrderKey = "template:{payload.id}" }, 0, 0},
		{"Kafka: one transaction per message", kafka, 0, 1},
		{"Kafka, MaxGroup set: stays", func(c *Config) { kafka(c); c.Claim.MaxGroup = 8 }, 0, 8},
		{"Kafka with a window: group commit", func(c *Config) { kafka(c); c.Broker.Kafka.Window = 16 }, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var c Config
			tc.edit(&c)
			got := groupDefaults(c)
			require.Equal(t, tc.wantWindow, got.Broker.AMQP.Window)
			require.Equal(t, c.Broker.Kafka.Window, got.Broker.Kafka.Window, "Kafka keeps the user's window")
			require.Equal(t, tc.wantGroup, got.Claim.MaxGroup)
		})
	}
}

// What Config.String prints is what New uses: Kafka's MaxGroup 1.
func TestGroupDefaultsPrinted(t *testing.T) {
	c := Config{Name: "loyalty", Topic: "t", Broker: brokers.Config{Kind: brokers.KindKafka}}
	require.Contains(t, c.String(), " MaxGroup:1 ")
	c.Broker.Kind = brokers.KindAMQP
	require.True(t, strings.Contains(c.String(), " MaxGroup:16 "), c.String())
}
