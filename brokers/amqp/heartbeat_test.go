package amqp

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/brokers"
	"github.com/claimtx/claimtx/brokers/internal/defaults"
)

// TestHeartbeat: the connection asks for a 10s heartbeat. Left at zero,
// amqp091 takes the server's (RabbitMQ: 60s) and declares a silently lost
// connection dead only after three missed heartbeats: three minutes during
// which IsConnected, and so readiness, would still say "connected".
func TestHeartbeat(t *testing.T) {
	wc, err := watermillConfig(defaults.Apply(brokers.AMQPConfig{}))
	require.NoError(t, err)
	require.Equal(t, 10*time.Second, wc.Connection.AmqpConfig.Heartbeat)
}
