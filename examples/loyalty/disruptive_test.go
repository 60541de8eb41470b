//go:build disruptive

package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/internal/testenv"
)

// Tests in this file drop RabbitMQ connections, their own only (by
// connection name), so the shared server's other clients are not
// disturbed. They run with -tags disruptive, one package at a time, after
// the parallel suite (make test-disruptive), without -race: the reconnect
// is racy inside watermill-amqp (see brokers/amqp/doc.go). They are not
// parallel.

// TestDisruptiveRabbitMQClosesAllConnections: RabbitMQ closes all of the
// consumer's connections and the test's own (rabbitmqctl close_connection,
// CONNECTION_FORCED, as on a broker restart) while the consumer is in the
// middle of a stream of orders. The consumer must reconnect by itself and
// consume the rest, including orders published after the disconnection;
// deliveries in flight when the connection dropped come back and are either
// applied or recognised as duplicates: exact balances, nothing lost.
func TestDisruptiveRabbitMQClosesAllConnections(t *testing.T) {
	testenv.RequireTool(t, "rabbitmqctl")
	h := newHarness(t, "amqp")
	// Nothing on the server is changed for good, but make sure RabbitMQ
	// takes connections again before the next test, pass or fail.
	t.Cleanup(func() {
		require.Eventually(t, func() bool {
			conn, err := amqp.Dial(h.amqpURL)
			if err != nil {
				return false
			}
			_ = conn.Close()
			return true
		}, 30*time.Second, 100*time.Millisecond, "RabbitMQ accepts connections again")
	})

	// 20ms in each claim transaction (4 at a time) and a producer that
	// keeps a small backlog make a stream that outlasts rabbitmqctl's slow
	// start, so the connections drop mid-stream with deliveries in flight
	// (some committed but not yet acked).
	// The consumer's connections carry a name of this test's, set as an
	// operator would (CONFIG_FILE, broker.amqp.connection_name).
	consumerConn := h.topic + " consumer"
	cfgFile := filepath.Join(t.TempDir(), "config.yaml")
	require.NoError(t, os.WriteFile(cfgFile, []byte("broker:\n  amqp:\n    connection_name: "+consumerConn+"\n"), 0o600))
	p := h.start("LOG_LEVEL=debug", "LOYALTY_HANDLER_DELAY=20ms", "CONFIG_FILE="+cfgFile)
	// The metrics address is logged at start-up; read it now.
	p.metricsURL(t)

	type result struct {
		closed int
		err    error
	}
	closed := make(chan result, 1)
	var all []order
	var closeOut result
	closeDone, extraBatches := false, 0
	const batch = 20
	for extraBatches < 10 {
		if !closeDone && len(all) == 4*batch {
			// A stream is flowing: RabbitMQ closes the consumer's and
			// the producer's connections while both carry on.
			go func() {
				n, err := testenv.CloseAMQPConnections(context.Background(), "claimtx disruptive test", consumerConn, h.topic)
				closed <- result{n, err}
			}()
		}
		next := orders(len(all)+1, batch)
		ids, payloads := encode(t, next)
		// The test's own connection is closed too: publish the batch again
		// until RabbitMQ confirms all of it. Copies are fine (the claim
		// dedups them); a lost order would not be.
		require.Eventually(t, func() bool {
			return h.tryPublishAMQP(h.topic, ids, payloads) == nil
		}, 30*time.Second, 50*time.Millisecond, "publish orders %d-%d", len(all)+1, len(all)+batch)
		all = append(all, next...)
		// Keep at most two batches of backlog.
		h.waitApplied(len(all) - 2*batch)
		if !closeDone {
			select {
			case closeOut = <-closed:
				closeDone = true
				require.NoError(t, closeOut.err)
				require.Equal(t, 3, closeOut.closed, "the consumer's two connections and the test's")
				t.Logf("%d connections closed at about order %d", closeOut.closed, len(all))
			default:
			}
		} else {
			extraBatches++
		}
		require.Less(t, len(all), 5000, "rabbitmqctl close_connection never returned")
	}

	// The consumer lost its connections (subscriber and poison publisher):
	// watermill-amqp logs the close notification and reconnects.
	p.waitLog(t, "Received close notification from AMQP, reconnecting")
	logs := p.out.String()
	require.Contains(t, logs, "CONNECTION_FORCED")
	require.GreaterOrEqual(t, strings.Count(logs, `msg="Connected to AMQP"`), 4,
		"the consumer's two connections were established twice")
	closedAt := strings.Index(logs, "Received close notification from AMQP")
	require.Contains(t, logs[:closedAt], `msg="loyalty: outcome"`, "orders were consumed before the disconnection")
	require.Contains(t, logs[closedAt:], `msg="loyalty: outcome"`, "orders were consumed after the reconnection")

	h.waitApplied(len(all))
	h.waitFor("every claim", func() bool {
		return h.tryCount(fmt.Sprintf(`SELECT count(*) FROM %q.processed_messages`, h.schema)) == len(all)
	})
	h.assertExact(all)
	require.True(t, p.running(), "the consumer reconnected instead of exiting")
	h.waitFor("the queue to drain", func() bool { return h.queueDepth(h.topic) == 0 })
	var got map[string]int
	require.Eventually(t, func() bool {
		got = p.outcomes(t)
		return got["applied"] == len(all)
	}, 30*time.Second, 20*time.Millisecond, "applied outcomes")
	require.Zero(t, got["failed"]+got["poisoned"], "outcomes: %v", got)
	t.Logf("outcomes: %v (duplicates are deliveries in flight when the connection dropped)", got)
}
