package claimtxcli

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/brokers"
	"github.com/claimtx/claimtx/internal/config"
)

// Every broker's credentials are scrubbed from what the CLI and the
// console print, NATS's too (its URL, password and token).
func TestBrokerSecretsCoverEveryBroker(t *testing.T) {
	cfg := brokers.Config{
		AMQP:  brokers.AMQPConfig{URL: "amqp://u:amqp-secret@h:5672/"},
		Kafka: brokers.KafkaConfig{SASL: brokers.KafkaSASLConfig{Mechanism: "PLAIN", User: "u", Password: "kafka-secret"}},
		NATS:  brokers.NATSConfig{URL: "nats://u:nats-url-secret@h:4222", Password: "nats-secret", Token: "nats-token"},
	}
	secrets := []string{"amqp-secret", "kafka-secret", "nats-url-secret", "nats-secret", "nats-token"}
	out := config.Scrub("connect failed: "+strings.Join(secrets, " "), brokerSecrets(cfg)...)
	for _, s := range secrets {
		require.NotContains(t, out, s)
	}
}
