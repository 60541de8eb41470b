package amqp_test

import (
	"context"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/brokers"
	"github.com/claimtx/claimtx/brokers/amqp"
	"github.com/claimtx/claimtx/framework"
)

// quorumConfig is testConfig on quorum queues.
func quorumConfig() brokers.AMQPConfig {
	cfg := testConfig()
	cfg.QueueType = "quorum"
	return cfg
}

// redeclare declares queue on a channel of its own (a refused declaration
// closes the channel) with args and returns RabbitMQ's answer: nil when
// args are the queue's arguments.
func redeclare(t *testing.T, queue string, args amqp091.Table) error {
	t.Helper()
	conn, err := amqp091.Dial(amqpURL())
	require.NoError(t, err)
	defer conn.Close()
	ch, err := conn.Channel()
	require.NoError(t, err)
	_, err = ch.QueueDeclare(queue, true, false, false, false, args)
	if err == nil {
		_ = ch.Close()
	}
	return err
}

// requireQuorum checks that queue exists as a quorum queue with the
// delivery limit limit (0: none), by redeclaring it.
func requireQuorum(t *testing.T, queue string, limit int) {
	t.Helper()
	args := amqp091.Table{"x-queue-type": "quorum"}
	if limit > 0 {
		args["x-delivery-limit"] = int64(limit)
	}
	require.NoError(t, redeclare(t, queue, args), "%s is a quorum queue with delivery limit %d", queue, limit)
	require.Error(t, redeclare(t, queue, nil), "%s is not a classic queue", queue)
}

// TestQuorumQueueDeclared: with QueueType "quorum" every declaration the
// adapter makes (Subscribe in both modes, SubscribeInitialize, the first
// Publish to a topic, as for a poison topic) creates a quorum queue, with
// the delivery limit when one is set.
func TestQuorumQueueDeclared(t *testing.T) {
	t.Parallel()
	perSub, window, initialized, published := uniqueName(t)+"-sub", uniqueName(t)+"-win", uniqueName(t)+"-init", uniqueName(t)+"-pub"
	deleteQueuesAtCleanup(t, perSub, window, initialized, published)

	cfg := quorumConfig()
	cfg.DeliveryLimit = 7
	sub := newSubscriber(t, cfg)
	_, err := sub.Subscribe(t.Context(), perSub)
	require.NoError(t, err)
	wcfg := cfg
	wcfg.Window = 8
	_, err = newSubscriber(t, wcfg).Subscribe(t.Context(), window)
	require.NoError(t, err)
	require.NoError(t, sub.SubscribeInitialize(initialized))
	publishPayloadsWith(t, cfg, published, "first")

	for _, q := range []string{perSub, window, initialized, published} {
		requireQuorum(t, q, 7)
	}
}

// TestQuorumRedelivery: a nacked message comes back from a quorum queue
// with x-delivery-count raised and the redelivered flag; both are
// metadata, never part of the key, so key specs over the producer's
// headers and payload (template, first) give the same key for every
// delivery.
func TestQuorumRedelivery(t *testing.T) {
	t.Parallel()
	topic := newQueue(t)
	sub := newSubscriber(t, quorumConfig())
	msgs, err := sub.Subscribe(t.Context(), topic)
	require.NoError(t, err)

	ch := rawChannel(t)
	require.NoError(t, ch.PublishWithContext(context.Background(), "", topic, false, false, amqp091.Publishing{
		Headers: amqp091.Table{"event_id": "evt-q1", "tenant": "acme"},
		Body:    []byte(`{"order_id": 4711}`),
	}))

	keys := keySpecs(t, "template:{metadata.tenant}:{metadata.event_id}", "first:metadata:event_id|json:order_id", "json:order_id")
	first := receive(t, msgs, 10*time.Second)
	// RabbitMQ 3.10 sets x-delivery-count 0 on the first delivery; newer
	// releases may leave it out until the first return.
	require.Contains(t, []string{"", "0"}, first.Metadata.Get("x-delivery-count"))
	want := keysOf(t, keys, first)
	require.Equal(t, []string{`acme:evt-q1`, "evt-q1", "4711"}, want)
	require.True(t, first.Nack())

	second := receive(t, msgs, 10*time.Second)
	require.Equal(t, "1", second.Metadata.Get("x-delivery-count"), "a quorum queue counts the return")
	require.Equal(t, "true", second.Metadata.Get(wamqp.MetadataRedeliveredKey))
	require.Equal(t, want, keysOf(t, keys, second), "keys never change with the delivery headers")
	require.True(t, second.Ack())
	requireQueueDrained(t, ch, topic, msgs)
}

// TestQuorumDeliveryLimit shows what RabbitMQ does when a message reaches
// x-delivery-limit (checked on the local RabbitMQ, 3.10; documented for
// 3.13 and 4.x to be the same): with limit N a message is delivered N+1
// times (x-delivery-count 0..N), and the return that takes it past N
// removes it from the queue: dropped without a trace, or dead-lettered
// with reason "delivery_limit" when the queue has a dead-letter exchange.
// The dead-lettered copy carries x-death and x-first-death-* headers,
// which the adapter passes on as metadata without breaking the keys.
func TestQuorumDeliveryLimit(t *testing.T) {
	t.Parallel()
	const limit = 2
	nackAll := func(t *testing.T, msgs <-chan *message.Message) []string {
		t.Helper()
		var counts []string
		for range limit + 1 {
			m := receive(t, msgs, 10*time.Second)
			counts = append(counts, m.Metadata.Get("x-delivery-count"))
			require.True(t, m.Nack())
		}
		return counts
	}

	t.Run("dropped", func(t *testing.T) {
		t.Parallel()
		topic := newQueue(t)
		cfg := quorumConfig()
		cfg.DeliveryLimit = limit
		sub := newSubscriber(t, cfg)
		msgs, err := sub.Subscribe(t.Context(), topic)
		require.NoError(t, err)
		publishPayloadsWith(t, cfg, topic, "doomed")
		counts := nackAll(t, msgs)
		require.Equal(t, "2", counts[limit], "delivered limit+1 times")
		requireQueueDrained(t, rawChannel(t), topic, msgs)
	})

	t.Run("dead-lettered", func(t *testing.T) {
		t.Parallel()
		topic := uniqueName(t)
		dlq := topic + "-dlq"
		deleteQueuesAtCleanup(t, topic, dlq)
		dlqSub := newSubscriber(t, quorumConfig())
		require.NoError(t, dlqSub.SubscribeInitialize(dlq))

		cfg := quorumConfig()
		cfg.DeliveryLimit = limit
		cfg.QueueArguments = map[string]any{"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq}
		sub := newSubscriber(t, cfg)
		msgs, err := sub.Subscribe(t.Context(), topic)
		require.NoError(t, err)
		ch := rawChannel(t)
		require.NoError(t, ch.PublishWithContext(context.Background(), "", topic, false, false, amqp091.Publishing{
			Headers: amqp091.Table{"event_id": "evt-dl"}, Body: []byte(`{"order_id": 99}`),
		}))
		keys := keySpecs(t, "template:order:{metadata.event_id}", "first:metadata:event_id|json:order_id")
		var want []string
		for range limit + 1 {
			m := receive(t, msgs, 10*time.Second)
			if want == nil {
				want = keysOf(t, keys, m)
			}
			require.True(t, m.Nack())
		}
		requireQueueDrained(t, ch, topic, msgs)

		dead, err := dlqSub.Subscribe(t.Context(), dlq)
		require.NoError(t, err)
		m := receive(t, dead, 10*time.Second)
		require.True(t, m.Ack())
		require.Equal(t, "delivery_limit", m.Metadata.Get("x-first-death-reason"))
		death := onlyDeath(t, m)
		require.Equal(t, "delivery_limit", death["reason"])
		require.Equal(t, topic, death["queue"])
		require.Equal(t, want, keysOf(t, keys, m), "the dead-lettered copy has the original's keys")
		require.Equal(t, []string{"order:evt-dl", "evt-dl"}, want)
	})
}

// TestQueueArgumentsMismatch: declaring a queue that exists with other
// arguments fails with a *framework.ConfigError that names the setting
// that differs and says what to do, wrapping RabbitMQ's 406 (which names
// the argument and both values), on every path that declares.
func TestQueueArgumentsMismatch(t *testing.T) {
	t.Parallel()
	classic, quorum5 := uniqueName(t)+"-classic", uniqueName(t)+"-quorum5"
	deleteQueuesAtCleanup(t, classic, quorum5)
	require.NoError(t, redeclare(t, classic, nil))
	require.NoError(t, redeclare(t, quorum5, amqp091.Table{"x-queue-type": "quorum", "x-delivery-limit": int64(5)}))

	limit3 := quorumConfig()
	limit3.DeliveryLimit = 3
	windowQuorum := quorumConfig()
	windowQuorum.Window = 4
	for _, tc := range []struct {
		name  string
		cfg   brokers.AMQPConfig
		queue string
		field string
	}{
		{"quorum config, classic queue", quorumConfig(), classic, "queue_type"},
		{"quorum window config, classic queue", windowQuorum, classic, "queue_type"},
		{"classic config, quorum queue", testConfig(), quorum5, "queue_type"},
		{"other delivery limit", limit3, quorum5, "delivery_limit"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			sub := newSubscriber(t, tc.cfg)
			_, subErr := sub.Subscribe(t.Context(), tc.queue)
			initErr := sub.SubscribeInitialize(tc.queue)
			pub, err := amqp.NewPublisher(context.Background(), tc.cfg, nil)
			require.NoError(t, err)
			defer func() { require.NoError(t, pub.Close()) }()
			pubErr := pub.Publish(tc.queue, message.NewMessage(watermill.NewUUID(), []byte("x")))
			t.Log(subErr)
			for _, err := range []error{subErr, initErr, pubErr} {
				var ce *framework.ConfigError
				require.ErrorAs(t, err, &ce)
				require.Equal(t, tc.field, ce.Field, "%v", err)
				require.Contains(t, ce.Reason, "rabbitmqctl delete_queue "+tc.queue, "says how to migrate")
				require.Contains(t, ce.Reason, "AMQP_", "names the variable")
				var aerr *amqp091.Error
				require.ErrorAs(t, err, &aerr, "RabbitMQ's error is kept")
				require.Equal(t, amqp091.PreconditionFailed, aerr.Code)
				require.Contains(t, err.Error(), "inequivalent arg")
			}
		})
	}
}

// keySpecs parses key specs.
func keySpecs(t *testing.T, specs ...string) []framework.KeyFunc {
	t.Helper()
	out := make([]framework.KeyFunc, len(specs))
	for i, s := range specs {
		k, err := framework.ParseKeySpec(s)
		require.NoError(t, err, s)
		out[i] = k
	}
	return out
}

// keysOf derives every key of m.
func keysOf(t *testing.T, keys []framework.KeyFunc, m *message.Message) []string {
	t.Helper()
	out := make([]string, len(keys))
	for i, k := range keys {
		var err error
		out[i], err = k(m)
		require.NoError(t, err)
	}
	return out
}
