package amqp_test

import (
	"context"
	"fmt"
	"maps"
	"sort"
	"testing"
	"time"

	"github.com/claimtx/claimtx/internal/amqpheader"
	"github.com/claimtx/claimtx/internal/testenv"

	"github.com/ThreeDotsLabs/watermill"
	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/brokers"
	"github.com/claimtx/claimtx/brokers/amqp"
	"github.com/claimtx/claimtx/framework"
)

// windowConfig is testConfig in the window mode.
func windowConfig(window int) brokers.AMQPConfig {
	cfg := testConfig()
	cfg.Window = window
	return cfg
}

// publishPayloads publishes one message per payload to topic and returns
// the payloads, sorted.
func publishPayloads(t *testing.T, topic string, payloads ...string) []string {
	t.Helper()
	return publishPayloadsWith(t, testConfig(), topic, payloads...)
}

func publishPayloadsWith(t *testing.T, cfg brokers.AMQPConfig, topic string, payloads ...string) []string {
	t.Helper()
	pub, err := amqp.NewPublisher(context.Background(), cfg, nil)
	require.NoError(t, err)
	defer func() { require.NoError(t, pub.Close()) }()
	for _, p := range payloads {
		require.NoError(t, pub.Publish(topic, message.NewMessage(watermill.NewUUID(), []byte(p))))
	}
	out := append([]string(nil), payloads...)
	sort.Strings(out)
	return out
}

func numbered(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s-%03d", prefix, i)
	}
	return out
}

// requireNothingMore asserts that no message arrives within wait.
func requireNothingMore(t *testing.T, msgs <-chan *message.Message, wait time.Duration, why string) {
	t.Helper()
	select {
	case m, ok := <-msgs:
		if ok {
			t.Fatalf("message %s (%q) arrived: %s", m.UUID, m.Payload, why)
		}
		t.Fatalf("messages channel closed: %s", why)
	case <-time.After(wait):
	}
}

func payloadsOf(ms []*message.Message) []string {
	out := make([]string, len(ms))
	for i, m := range ms {
		out[i] = string(m.Payload)
	}
	sort.Strings(out)
	return out
}

// TestWindow: with Window N, N messages arrive without any ack, the N+1th
// only once they are acked, and every message is received exactly once.
func TestWindow(t *testing.T) {
	t.Parallel()
	const n = 5
	topic := newQueue(t)
	want := publishPayloads(t, topic, numbered("w", 3*n)...)

	sub := newSubscriber(t, windowConfig(n))
	msgs, err := sub.Subscribe(t.Context(), topic)
	require.NoError(t, err)

	var got []*message.Message
	for range 3 {
		var held []*message.Message
		for range n {
			held = append(held, receive(t, msgs, 10*time.Second))
		}
		requireNothingMore(t, msgs, 300*time.Millisecond, fmt.Sprintf("%d are unacked and the window is %d", n, n))
		for _, m := range held {
			require.True(t, m.Ack())
		}
		got = append(got, held...)
	}
	require.Equal(t, want, payloadsOf(got))
	requireQueueDrained(t, rawChannel(t), topic, msgs)
}

// TestWindowNack: a nacked message comes back after NackDelay, and holds
// only its own window slot meanwhile: the others keep flowing.
func TestWindowNack(t *testing.T) {
	t.Parallel()
	const delay = 1500 * time.Millisecond
	topic := newQueue(t)
	publishPayloads(t, topic, "bad")
	want := publishPayloads(t, topic, numbered("ok", 6)...)

	cfg := windowConfig(2)
	cfg.NackDelay = delay
	sub := newSubscriber(t, cfg)
	msgs, err := sub.Subscribe(t.Context(), topic)
	require.NoError(t, err)

	// One consumer on a classic queue: "bad" comes first.
	bad := receive(t, msgs, 10*time.Second)
	require.Equal(t, "bad", string(bad.Payload))
	require.Empty(t, bad.Metadata.Get(wamqp.MetadataRedeliveredKey))
	nackedAt := time.Now()
	require.True(t, bad.Nack())

	// With "bad" held for the delay, one slot of two is left: the six
	// others pass through it, one at a time, before the delay ends.
	got := receiveAcked(t, msgs, len(want))
	require.Less(t, time.Since(nackedAt), delay, "the other messages waited for the nack delay")
	require.Equal(t, want, got)

	again := receive(t, msgs, 10*time.Second)
	require.GreaterOrEqual(t, time.Since(nackedAt), delay)
	require.Equal(t, "bad", string(again.Payload))
	require.Equal(t, bad.UUID, again.UUID)
	require.Equal(t, "true", again.Metadata.Get(wamqp.MetadataRedeliveredKey))
	require.True(t, again.Ack())
	requireQueueDrained(t, rawChannel(t), topic, msgs)
}

// TestWindowCloseReturnsUnacked: Close with messages taken but not acked
// (and more prefetched but not taken) loses none: a new subscriber gets
// them all.
func TestWindowCloseReturnsUnacked(t *testing.T) {
	t.Parallel()
	topic := newQueue(t)
	want := publishPayloads(t, topic, numbered("c", 6)...)

	sub, err := amqp.NewSubscriber(context.Background(), windowConfig(10), nil)
	require.NoError(t, err)
	msgs, err := sub.Subscribe(t.Context(), topic)
	require.NoError(t, err)
	var held []*message.Message
	for range 3 {
		held = append(held, receive(t, msgs, 10*time.Second))
	}
	require.NoError(t, sub.Close())
	for range msgs { //nolint:revive // Close closed the channel; drain it
	}
	for _, m := range held {
		m.Ack() // too late: no effect, the channel is gone
	}
	require.NoError(t, sub.Close(), "Close is idempotent")
	_, err = sub.Subscribe(t.Context(), topic)
	require.Error(t, err, "subscribe after close")

	sub2 := newSubscriber(t, windowConfig(10))
	msgs2, err := sub2.Subscribe(t.Context(), topic)
	require.NoError(t, err)
	require.Equal(t, want, receiveAcked(t, msgs2, len(want)))
	requireQueueDrained(t, rawChannel(t), topic, msgs2)
}

// TestWindowContextCancel: ending the Subscribe context closes the channel
// and returns unacked messages; the Subscriber stays usable.
func TestWindowContextCancel(t *testing.T) {
	t.Parallel()
	topic := newQueue(t)
	want := publishPayloads(t, topic, numbered("x", 4)...)

	sub := newSubscriber(t, windowConfig(8))
	ctx, cancel := context.WithCancel(t.Context())
	msgs, err := sub.Subscribe(ctx, topic)
	require.NoError(t, err)
	held := receive(t, msgs, 10*time.Second)
	require.NoError(t, held.Context().Err(), "the message context lives while the message is unsettled")
	cancel()
	for range msgs { //nolint:revive // drain until closed
	}
	require.Error(t, held.Context().Err(), "the message context ends with the subscription")

	msgs, err = sub.Subscribe(t.Context(), topic)
	require.NoError(t, err)
	require.Equal(t, want, receiveAcked(t, msgs, len(want)))
}

// TestWindowMetadataMatchesDefault: the same published message gives the
// same UUID, Metadata and Payload in the window mode and in the default
// mode, first delivery and redelivery alike.
func TestWindowMetadataMatchesDefault(t *testing.T) {
	t.Parallel()
	wm := message.NewMessage("uuid-same", []byte(`{"order_id":"o-7"}`))
	wm.Metadata.Set("event_id", "evt-7")
	fromWatermill, err := amqp.Marshaler{}.Marshal(wm)
	require.NoError(t, err)
	plain := amqp091.Publishing{
		Headers: amqp091.Table{
			"event_id": "evt-plain",
			"retries":  int32(2),
			"ok":       true,
			"x-death":  []any{amqp091.Table{"count": int64(1), "reason": "rejected", "queue": "q"}},
		},
		MessageId:     "mid-1",
		CorrelationId: "corr-1",
		ContentType:   "application/json",
		Timestamp:     time.Date(2024, 5, 6, 7, 8, 9, 0, time.UTC),
		Body:          []byte("plain body"),
	}

	for name, p := range map[string]amqp091.Publishing{"watermill": fromWatermill, "plain": plain} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			// One queue per mode: sharing one would let a message acked
			// just before the first subscriber's Close come back to the
			// second (the default mode may turn that ack into a requeue).
			// Only the routing key differs then.
			defTopic, winTopic := uniqueName(t)+"-default", uniqueName(t)+"-window"
			deleteQueuesAtCleanup(t, defTopic, winTopic)
			ch := rawChannel(t)

			// consume publishes p to topic, takes it, nacks it, takes the
			// redelivery and acks it.
			consume := func(cfg brokers.AMQPConfig, topic string) (first, again *message.Message) {
				_, err := ch.QueueDeclare(topic, true, false, false, false, nil)
				require.NoError(t, err)
				require.NoError(t, ch.PublishWithContext(t.Context(), "", topic, false, false, p))
				sub, err := amqp.NewSubscriber(context.Background(), cfg, nil)
				require.NoError(t, err)
				defer func() { require.NoError(t, sub.Close()) }()
				msgs, err := sub.Subscribe(t.Context(), topic)
				require.NoError(t, err)
				first = receive(t, msgs, 10*time.Second)
				require.True(t, first.Nack())
				again = receive(t, msgs, 10*time.Second)
				require.True(t, again.Ack())
				require.Equal(t, topic, first.Metadata.Get(amqpheader.RoutingKey))
				require.Equal(t, topic, again.Metadata.Get(amqpheader.RoutingKey))
				return first, again
			}
			def := testConfig()
			def.Concurrency = 1
			defFirst, defAgain := consume(def, defTopic)
			winFirst, winAgain := consume(windowConfig(4), winTopic)

			for _, pair := range [][2]*message.Message{{defFirst, winFirst}, {defAgain, winAgain}} {
				d, w := pair[0], pair[1]
				if name == "watermill" {
					require.Equal(t, d.UUID, w.UUID)
				}
				dm, wm := maps.Clone(d.Metadata), maps.Clone(w.Metadata)
				delete(dm, amqpheader.RoutingKey)
				delete(wm, amqpheader.RoutingKey)
				require.Equal(t, dm, wm)
				require.Equal(t, d.Payload, w.Payload)
			}
			require.Empty(t, winFirst.Metadata.Get(wamqp.MetadataRedeliveredKey))
			require.Equal(t, "true", winAgain.Metadata.Get(wamqp.MetadataRedeliveredKey))
			require.Equal(t, winFirst.UUID, winAgain.UUID)
			if name == "plain" {
				require.Equal(t, "mid-1", winFirst.UUID, "the UUID comes from message-id")
			} else {
				require.Equal(t, "uuid-same", winFirst.UUID)
			}
		})
	}
}

// TestWindowConfig: Window must be in [0, maxWindow]; a bad value is a
// ConfigError naming "window", returned before any connection attempt.
func TestWindowConfig(t *testing.T) {
	t.Parallel()
	for _, w := range []int{-1, amqp.MaxWindow + 1, 1 << 20} {
		cfg := testConfig()
		cfg.Window = w
		err := cfg.Validate()
		var ce *framework.ConfigError
		require.ErrorAs(t, err, &ce, "window %d", w)
		require.Equal(t, "window", ce.Field)
		_, err = amqp.NewSubscriber(context.Background(), cfg, nil)
		require.ErrorAs(t, err, &ce, "NewSubscriber validates: window %d", w)
		require.Equal(t, "window", ce.Field)
	}
	for _, w := range []int{0, 1, amqp.MaxWindow} {
		cfg := testConfig()
		cfg.Window = w
		require.NoError(t, cfg.Validate(), "window %d", w)
	}
	cfg := testConfig()
	cfg.Window = 123
	require.Contains(t, cfg.String(), "Window:123")
	require.Contains(t, fmt.Sprintf("%#v", cfg), "Window:123")
}

// TestWindowSharesQueueArguments: the window mode declares the queue like
// the default mode (same durable flag and QueueArguments), so both modes
// consume the same queue; mismatching arguments fail Subscribe.
func TestWindowSharesQueueArguments(t *testing.T) {
	t.Parallel()
	topic := newQueue(t)
	cfg := testConfig()
	cfg.QueueArguments = map[string]any{"x-max-priority": 5}
	def := newSubscriber(t, cfg)
	require.NoError(t, def.SubscribeInitialize(topic))

	wcfg := cfg
	wcfg.Window = 4
	win := newSubscriber(t, wcfg)
	msgs, err := win.Subscribe(t.Context(), topic)
	require.NoError(t, err)
	publishPayloadsWith(t, cfg, topic, "shared")
	require.Equal(t, "shared", string(receive(t, msgs, 10*time.Second).Payload))

	bad := testConfig() // no arguments: RabbitMQ refuses the redeclaration
	bad.Window = 4
	other := newSubscriber(t, bad)
	_, err = other.Subscribe(t.Context(), topic)
	var aerr *amqp091.Error
	require.ErrorAs(t, err, &aerr)
	require.Equal(t, amqp091.PreconditionFailed, aerr.Code)
}

// TestWindowQueueDeleted: RabbitMQ cancels the consumer when its queue is
// deleted (the channel stays open); the window consumer opens a new channel,
// declares the queue again and goes on.
func TestWindowQueueDeleted(t *testing.T) {
	t.Parallel()
	topic := newQueue(t)
	publishPayloads(t, topic, "before")

	sub := newSubscriber(t, windowConfig(4))
	before, msgs := testenv.SubscribeReceive(t, sub, topic, 10*time.Second)
	require.Equal(t, "before", string(before.Payload))
	require.True(t, before.Ack())

	ch := rawChannel(t)
	_, err := ch.QueueDelete(topic, false, false, false)
	require.NoError(t, err)
	requireConsumers(t, topic, 1)

	want := publishPayloads(t, topic, numbered("after", 3)...)
	require.Equal(t, want, receiveAcked(t, msgs, len(want)))
}

// requireConsumers waits until queue exists with n consumers. A passive
// declaration of a missing queue closes its channel, so each try has its own.
func requireConsumers(t *testing.T, queue string, n int) {
	t.Helper()
	conn, err := amqp091.Dial(amqpURL())
	require.NoError(t, err)
	defer conn.Close()
	require.Eventually(t, func() bool {
		ch, err := conn.Channel()
		if err != nil {
			return false
		}
		defer ch.Close()
		q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
		return err == nil && q.Consumers == n
	}, 20*time.Second, 50*time.Millisecond)
}

// TestWindowReconnect: RabbitMQ closes the connection while a message is
// in flight. The message comes back on the new channel (the late ack of the
// old copy has no effect there) and consumption goes on. Skipped under
// -race like TestReconnect (watermill-amqp's reconnect path is racy).
func TestWindowReconnect(t *testing.T) {
	skipUnlessReconnectable(t)
	t.Parallel()
	topic := newQueue(t)
	publishPayloads(t, topic, "held", "second")

	cfg := windowConfig(1)
	cfg.ConnectionName = uniqueName(t)
	sub := newSubscriber(t, cfg)
	held, msgs := testenv.SubscribeReceive(t, sub, topic, 10*time.Second)
	require.Equal(t, "held", string(held.Payload))
	require.Equal(t, 1, closeConnectionsNamed(t, cfg.ConnectionName))

	again := receive(t, msgs, 30*time.Second)
	require.Equal(t, "held", string(again.Payload))
	require.Equal(t, "true", again.Metadata.Get(wamqp.MetadataRedeliveredKey))
	// The stale copy's delivery tag is 1 on the old channel; so is the
	// redelivery's on the new one. Acking the stale copy must not ack it:
	// with Window 1, "second" would then arrive.
	held.Ack()
	requireNothingMore(t, msgs, 300*time.Millisecond, "the stale ack settled the redelivery")
	require.True(t, again.Ack())
	require.Equal(t, "second", string(receive(t, msgs, 10*time.Second).Payload))
}
