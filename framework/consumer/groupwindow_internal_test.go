package consumer

import (
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/brokers"
)

// TestGroupWindow: group commit gives RabbitMQ the window it needs, and
// nothing else: not a window the user set, not Kafka (its order), not
// without group commit.
func TestGroupWindow(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*Config)
		want int
	}{
		{"default: 4 x 16", func(*Config) {}, 64},
		{"concurrency 3, group 8", func(c *Config) { c.Broker.AMQP.Concurrency, c.Claim.MaxGroup = 3, 8 }, 24},
		{"capped at the AMQP prefetch limit", func(c *Config) { c.Broker.AMQP.Concurrency, c.Claim.MaxGroup = 1024, 64 }, maxAMQPWindow},
		{"the user's window stays", func(c *Config) { c.Broker.AMQP.Window = 5 }, 5},
		{"MaxGroup 1: none", func(c *Config) { c.Claim.MaxGroup = 1 }, 0},
		{"SERIALIZABLE: none", func(c *Config) { c.Claim.Isolation = pgx.Serializable }, 0},
		{"Kafka: none", func(c *Config) { c.Broker.Kind = brokers.KindKafka }, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var c Config
			tc.edit(&c)
			b := groupWindow(c)
			require.Equal(t, tc.want, b.AMQP.Window)
			require.Zero(t, b.Kafka.Window, "Kafka keeps a partition's order")
		})
	}
}
