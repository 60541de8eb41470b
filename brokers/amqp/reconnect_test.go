package amqp_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/brokers/amqp"
	"github.com/claimtx/claimtx/internal/testenv"
)

// skipUnlessReconnectable skips a test that drops connections with
// closeConnectionsNamed when it cannot run: under -race (see TestReconnect;
// make test-disruptive runs it without -race, CI included). Without
// rabbitmqctl it skips too, but fails under CI, whose machine runs
// rabbitmq-server and so has the tool.
func skipUnlessReconnectable(t *testing.T) {
	t.Helper()
	if raceEnabled && os.Getenv("CLAIMTX_RECONNECT_UNDER_RACE") == "" {
		t.Skip("watermill-amqp's reconnect path is racy (connection.go:139 vs :114); run without -race")
	}
	testenv.RequireTool(t, "rabbitmqctl")
}

// closeConnectionsNamed makes RabbitMQ close the connections whose
// connection_name is name, and only those, so the test does not disturb
// the other tests sharing the broker.
func closeConnectionsNamed(t *testing.T, name string) int {
	t.Helper()
	closed, err := testenv.CloseAMQPConnections(t.Context(), "claimtx reconnect test", name)
	require.NoError(t, err)
	return closed
}

// TestReconnect: RabbitMQ closes the adapter's connections; the subscriber
// resumes by itself and the publisher works again once reconnected.
//
// Skipped under the race detector: watermill-amqp v3.0.2 replaces its
// "connected" channel without synchronisation when a connection drops
// (written at connection.go:136/139, read by IsConnected at
// connection.go:114), which -race reports as a data race in the dependency
// (set CLAIMTX_RECONNECT_UNDER_RACE=1 to see it). Run it with:
//
//	go test -count=1 -run TestReconnect ./brokers/amqp/
func TestReconnect(t *testing.T) {
	skipUnlessReconnectable(t)
	t.Parallel()
	topic := newQueue(t)
	cfg := testConfig()
	cfg.Concurrency = 2
	cfg.ConnectionName = uniqueName(t)

	pub, err := amqp.NewPublisher(context.Background(), cfg, nil)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, pub.Close()) })
	sub := newSubscriber(t, cfg)
	msgs, err := sub.Subscribe(t.Context(), topic)
	require.NoError(t, err)

	require.NoError(t, pub.Publish(topic, message.NewMessage("before", nil)))
	first := receive(t, msgs, 10*time.Second)
	require.Equal(t, "before", first.UUID)
	first.Ack()

	require.Equal(t, 2, closeConnectionsNamed(t, cfg.ConnectionName), "publisher and subscriber connections")

	// Publish fails while the publisher reconnects; a caller retries.
	require.Eventually(t, func() bool {
		return pub.Publish(topic, message.NewMessage("after", nil)) == nil
	}, 20*time.Second, 50*time.Millisecond)
	m := receive(t, msgs, 20*time.Second)
	for m.UUID != "after" { // "before" may come again if its ack was lost
		m.Ack()
		m = receive(t, msgs, 20*time.Second)
	}
	m.Ack()
}
