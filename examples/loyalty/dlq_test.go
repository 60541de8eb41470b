package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/internal/testenv"
)

// TestRabbitMQDeadLetterReplay replays a real RabbitMQ dead-letter queue into
// the loyalty queue. RabbitMQ dead-letters the rejected orders itself, so the
// replayed copies carry its x-death header (an array of tables holding longs,
// timestamps and arrays), which Watermill's default AMQP marshaler rejects:
// without claimtx's marshaler the replay would be nacked and requeued
// forever. Half of the dead-lettered orders were already credited through
// the normal path; they must be recognised as duplicates, the others
// applied, and the queue must drain for good.
//
// The consumer keys on the producer's event_id header (KEY=metadata:event_id),
// so the test also proves the replay keeps the producer's headers usable.
func TestRabbitMQDeadLetterReplay(t *testing.T) {
	t.Parallel()
	testenv.RequireTool(t, "rabbitmqctl")
	h := newHarness(t, "amqp")
	src, dlq := h.topic+".src", h.topic+".dlq"
	h.deleteQueuesAtCleanup(src, dlq)
	ch, err := h.amqp().Channel()
	require.NoError(t, err)
	_, err = ch.QueueDeclare(dlq, true, false, false, false, nil)
	require.NoError(t, err)
	_, err = ch.QueueDeclare(src, true, false, false, false, amqp.Table{
		"x-dead-letter-exchange":    "",
		"x-dead-letter-routing-key": dlq,
	})
	require.NoError(t, err)
	require.NoError(t, ch.Close())

	p := h.start("KEY=metadata:event_id")
	all := orders(1, 16)
	normal, deadLettered, fresh := all[:10], all[5:15], all[15:]

	// Orders 1-10 reach the loyalty queue and are credited.
	h.publish(normal...)
	h.waitApplied(len(normal))

	// Orders 6-15 go to the source queue and are rejected there, so
	// RabbitMQ moves them to the DLQ with an x-death header.
	ids, payloads := encode(t, deadLettered)
	h.publishAMQP(src, ids, payloads)
	rejectAll(t, h, src, len(deadLettered))
	h.waitFor("dead-lettered", func() bool { return h.queueDepth(dlq) == len(deadLettered) })
	require.Zero(t, h.queueDepth(src))

	// Replay: every DLQ message back to the loyalty queue, as is.
	replayed := replay(t, h, dlq, h.topic, len(deadLettered))
	for _, id := range ids {
		require.Contains(t, replayed, id)
	}

	// A normal order after the replay: the consumer is not stuck.
	h.publish(fresh...)
	h.waitApplied(len(all))

	// Every delivery was either applied or a recorded duplicate: 10 + 10 + 1
	// deliveries = 16 applied + 5 duplicates (orders 6-10 came twice).
	var got map[string]int
	require.Eventually(t, func() bool {
		got = p.outcomes(t)
		return got["applied"] == len(all) && got["duplicate"] == 5
	}, 30*time.Second, 20*time.Millisecond, "outcomes")
	require.Zero(t, got["failed"]+got["poisoned"], "outcomes: %v", got)
	h.assertExact(all)
	require.Equal(t, len(all), h.count(fmt.Sprintf(`SELECT count(*) FROM %q.processed_messages`, h.schema)), "claims")

	// No loop: the queue is empty and stays empty, nothing is being
	// redelivered (ready and unacked both 0, and the outcome counters do not
	// move), and nothing was poisoned.
	require.Eventually(t, func() bool {
		ready, unacked := queueStats(t, h.topic)
		return ready == 0 && unacked == 0
	}, 30*time.Second, 200*time.Millisecond, "loyalty queue drained")
	require.Never(t, func() bool { return h.queueDepth(h.topic) != 0 }, time.Second, 20*time.Millisecond, "loyalty queue refilled")
	ready, unacked := queueStats(t, h.topic)
	require.Zero(t, ready+unacked, "loyalty queue: %d ready, %d unacked", ready, unacked)
	require.Equal(t, got, p.outcomes(t), "outcome counters moved after the drain")
	require.Zero(t, h.queueDepth(h.topic+".poison"), "poisoned messages")
	require.Zero(t, h.queueDepth(dlq))
	require.NotContains(t, p.out.String(), "level=ERROR")
}

func encode(t *testing.T, os []order) (ids []string, payloads [][]byte) {
	t.Helper()
	for _, o := range os {
		b, err := json.Marshal(o)
		require.NoError(t, err)
		ids, payloads = append(ids, fmt.Sprintf("evt-%d", o.OrderID)), append(payloads, b)
	}
	return ids, payloads
}

// rejectAll takes n messages from queue and rejects them without requeue
// (basic.reject requeue=false), which dead-letters them.
func rejectAll(t *testing.T, h *harness, queue string, n int) {
	t.Helper()
	ch, err := h.amqp().Channel()
	require.NoError(t, err)
	defer func() { _ = ch.Close() }()
	rejected := 0
	h.waitFor("messages to reject", func() bool {
		for {
			d, ok, err := ch.Get(queue, false)
			require.NoError(t, err)
			if !ok {
				return rejected == n
			}
			require.NoError(t, d.Reject(false))
			rejected++
		}
	})
}

// replay moves n messages from the dead-letter queue to queue through the
// default exchange, keeping body, properties and every header (x-death
// included), the way an operator's shovel or script does. It checks that
// RabbitMQ's x-death is there and returns the replayed event ids.
func replay(t *testing.T, h *harness, dlq, queue string, n int) []string {
	t.Helper()
	ch, err := h.amqp().Channel()
	require.NoError(t, err)
	defer func() { _ = ch.Close() }()
	require.NoError(t, ch.Confirm(false))
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation, 1))
	var ids []string
	for len(ids) < n {
		d, ok, err := ch.Get(dlq, false)
		require.NoError(t, err)
		require.True(t, ok, "DLQ ran dry after %d of %d", len(ids), n)

		deaths, ok := d.Headers["x-death"].([]any)
		require.True(t, ok, "x-death is %T", d.Headers["x-death"])
		require.Len(t, deaths, 1)
		death, ok := deaths[0].(amqp.Table)
		require.True(t, ok, "x-death[0] is %T", deaths[0])
		require.Equal(t, "rejected", death["reason"])
		require.Equal(t, strings.TrimSuffix(dlq, ".dlq")+".src", death["queue"])
		require.Equal(t, int64(1), death["count"])
		require.IsType(t, time.Time{}, death["time"])
		require.IsType(t, []any{}, death["routing-keys"])
		id, ok := d.Headers["event_id"].(string)
		require.True(t, ok, "event_id survived dead-lettering")

		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err = ch.PublishWithContext(ctx, "", queue, false, false, amqp.Publishing{
			Headers: d.Headers, ContentType: d.ContentType, DeliveryMode: amqp.Persistent,
			MessageId: d.MessageId, Timestamp: d.Timestamp, Body: d.Body,
		})
		cancel()
		require.NoError(t, err)
		require.True(t, (<-confirms).Ack, "RabbitMQ confirmed the replayed message")
		require.NoError(t, d.Ack(false))
		ids = append(ids, id)
	}
	return ids
}
