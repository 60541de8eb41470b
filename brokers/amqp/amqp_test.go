package amqp_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/tests"
	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/brokers"
	"github.com/claimtx/claimtx/brokers/amqp"
	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/internal/amqpheader"
	"github.com/claimtx/claimtx/internal/testenv"
)

// TestPubSubConformance runs Watermill's Pub/Sub suite against the adapter
// as claimtx builds it, twice:
//
//   - Concurrency 1: the ordering tests apply (TestNoAck checks that no
//     second message arrives before the first is acked, which Concurrency > 1
//     does on purpose). The full suite, except under -short.
//   - Concurrency 4 (the default): without the ordering features, in the
//     suite's short form, to cover the merged channels and the proxy ack.
//   - Window 16: the window mode, likewise without the ordering features
//     (it forwards the next message before the previous one is acked, and a
//     nacked message is requeued behind those already delivered), short form.
//
// There are no consumer groups (one queue per topic is the design).
// TestReconnect needs a broker restart command and is skipped by the suite:
// restarting the shared RabbitMQ would break tests running beside it.
func TestPubSubConformance(t *testing.T) {
	t.Parallel()
	t.Run("concurrency1", func(t *testing.T) {
		t.Parallel()
		cfg := testConfig()
		cfg.Concurrency = 1
		runSuite(t, cfg, tests.Features{
			GuaranteedOrder:                     true,
			GuaranteedOrderWithSingleSubscriber: true,
			Persistent:                          true,
			ForceShort:                          testing.Short(),
		})
	})
	t.Run("concurrency4", func(t *testing.T) {
		t.Parallel()
		cfg := testConfig()
		cfg.Concurrency = 4
		runSuite(t, cfg, tests.Features{Persistent: true, ForceShort: true})
	})
	t.Run("window16", func(t *testing.T) {
		t.Parallel()
		cfg := testConfig()
		cfg.Window = 16
		runSuite(t, cfg, tests.Features{Persistent: true, ForceShort: true})
	})
}

func runSuite(t *testing.T, cfg brokers.AMQPConfig, features tests.Features) {
	var q queueTracker
	t.Cleanup(func() { q.cleanup(t) })

	logger := watermill.NopLogger{}
	// The suite closes one subscriber before using it
	// (test_pubsub.go:458 "defer require.NoError(t, sub.Close())" evaluates
	// Close at once), which leaks the subscriber its multiplier creates
	// afterwards.
	closeAtEnd := testenv.CloseAtEnd(t)
	features.GenerateTopicFunc = func(tctx tests.TestContext) string {
		return "claimtx-conformance-" + string(tctx.TestID)
	}
	tests.TestPubSub(t, features,
		func(t *testing.T) (message.Publisher, message.Subscriber) {
			pub, err := amqp.NewPublisher(context.Background(), cfg, logger)
			require.NoError(t, err)
			sub, err := amqp.NewSubscriber(context.Background(), cfg, logger)
			require.NoError(t, err)
			closeAtEnd(pub, sub)
			return trackingPublisher{pub.(*amqp.Publisher), &q}, trackingSubscriber{sub.(*amqp.Subscriber), &q}
		},
		nil,
	)
}

// TestPlainProducer: a producer that knows nothing of Watermill publishes to
// the default exchange with routing key = topic and an event_id header.
func TestPlainProducer(t *testing.T) {
	t.Parallel()
	topic := newQueue(t)

	sub := newSubscriber(t, testConfig())
	require.NoError(t, sub.SubscribeInitialize(topic))

	ch := rawChannel(t)
	ts := time.Date(2024, 5, 6, 7, 8, 9, 0, time.UTC)
	require.NoError(t, ch.PublishWithContext(context.Background(), "", topic, false, false, amqp091.Publishing{
		Headers:     amqp091.Table{"event_id": "evt-42"},
		ContentType: "application/json",
		Timestamp:   ts,
		Body:        []byte(`{"order_id":"o-1"}`),
	}))

	m, _ := testenv.SubscribeReceive(t, sub, topic, 10*time.Second)
	require.True(t, m.Ack())

	require.NotEmpty(t, m.UUID, "a UUID is generated for plain producers")
	require.Equal(t, "evt-42", m.Metadata.Get("event_id"))
	require.Equal(t, `{"order_id":"o-1"}`, string(m.Payload))
	require.Equal(t, topic, m.Metadata.Get(amqpheader.RoutingKey))
	require.Equal(t, "", m.Metadata.Get(amqpheader.Exchange))
	require.Equal(t, "application/json", m.Metadata.Get(amqpheader.ContentType))
	require.Equal(t, ts.Format(time.RFC3339Nano), m.Metadata.Get(amqpheader.Timestamp))
}

// TestDeadLetterReplay reproduces the replay of a real dead-letter queue:
// RabbitMQ moves a rejected message to the DLQ and adds its x-death table
// (arrays of tables with longs, timestamps and strings). Watermill's
// DefaultMarshaler rejects that header, which nacks with requeue, forever.
// Our marshaler consumes it once.
func TestDeadLetterReplay(t *testing.T) {
	t.Parallel()
	work, dlq := uniqueName(t), uniqueName(t)+"-dlq"
	deleteQueuesAtCleanup(t, work, dlq)

	ch := rawChannel(t)
	_, err := ch.QueueDeclare(dlq, true, false, false, false, nil)
	require.NoError(t, err)
	_, err = ch.QueueDeclare(work, true, false, false, false, amqp091.Table{
		"x-dead-letter-exchange":    "",
		"x-dead-letter-routing-key": dlq,
	})
	require.NoError(t, err)
	require.NoError(t, ch.PublishWithContext(context.Background(), "", work, false, false, amqp091.Publishing{
		Headers: amqp091.Table{"event_id": "evt-dead"},
		Body:    []byte("payload"),
	}))
	// Reject it without requeue: RabbitMQ dead-letters it into dlq.
	d, ok, err := ch.Get(work, false)
	require.NoError(t, err)
	require.True(t, ok)
	require.NoError(t, d.Nack(false, false))

	// The DLQ message as RabbitMQ wrote it, for the contrast below.
	var dead amqp091.Delivery
	require.Eventually(t, func() bool {
		dead, ok, err = ch.Get(dlq, false)
		return err == nil && ok
	}, 10*time.Second, 20*time.Millisecond)
	require.IsType(t, []any{}, dead.Headers["x-death"], "RabbitMQ sets x-death as an array of tables")
	_, err = wamqp.DefaultMarshaler{}.Unmarshal(dead)
	require.Error(t, err, "watermill's DefaultMarshaler rejects x-death: that is the requeue loop this adapter avoids")
	require.NoError(t, dead.Nack(false, true)) // back into dlq for the subscriber

	sub := newSubscriber(t, testConfig())
	m, msgs := testenv.SubscribeReceive(t, sub, dlq, 10*time.Second)
	require.True(t, m.Ack())
	require.Equal(t, "evt-dead", m.Metadata.Get("event_id"))
	death := onlyDeath(t, m)
	require.Equal(t, "rejected", death["reason"])
	require.Equal(t, work, death["queue"])
	require.EqualValues(t, 1, death["count"])

	// Acked once, not looping: the queue is empty and nothing comes again.
	requireQueueDrained(t, ch, dlq, msgs)
}

// TestNonStringHeaders publishes every AMQP field type a producer can send.
func TestNonStringHeaders(t *testing.T) {
	t.Parallel()
	topic := newQueue(t)

	sub := newSubscriber(t, testConfig())
	require.NoError(t, sub.SubscribeInitialize(topic))

	when := time.Date(2023, 1, 2, 3, 4, 5, 0, time.UTC)
	ch := rawChannel(t)
	require.NoError(t, ch.PublishWithContext(context.Background(), "", topic, false, false, amqp091.Publishing{
		Headers: amqp091.Table{
			"event_id": "evt-types",
			"x-death": []any{amqp091.Table{
				"count": int64(3), "reason": "expired", "queue": "q", "time": when,
				"routing-keys": []any{"a", "b"},
			}},
			"retries": int32(2),
			"big":     int64(1) << 40,
			"ok":      true,
			"ratio":   0.5,
			"when":    when,
			"nothing": nil,
			"bin":     []byte{0xff, 0x00},
			"text":    []byte("plain bytes"),
			"nested":  amqp091.Table{"a": amqp091.Table{"b": []any{int16(1), "two"}}},
		},
		Body: []byte("x"),
	}))

	m, msgs := testenv.SubscribeReceive(t, sub, topic, 10*time.Second)
	require.True(t, m.Ack())

	want := map[string]string{
		"event_id": "evt-types",
		"x-death":  `[{"count":3,"queue":"q","reason":"expired","routing-keys":["a","b"],"time":"2023-01-02T03:04:05Z"}]`,
		"retries":  "2",
		"big":      "1099511627776",
		"ok":       "true",
		"ratio":    "0.5",
		"when":     `"2023-01-02T03:04:05Z"`,
		"nothing":  "null",
		"bin":      `"/wA="`,
		"text":     "plain bytes",
		"nested":   `{"a":{"b":[1,"two"]}}`,
	}
	for k, v := range want {
		require.Equal(t, v, m.Metadata.Get(k), "header %s", k)
	}
	requireQueueDrained(t, ch, topic, msgs)
}

// requireQueueDrained checks the queue holds no message (ready or
// unacked) and that the subscription gets nothing more.
func requireQueueDrained(t *testing.T, ch *amqp091.Channel, queue string, msgs <-chan *message.Message) {
	t.Helper()
	require.Eventually(t, func() bool {
		q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
		return err == nil && q.Messages == 0
	}, 5*time.Second, 20*time.Millisecond)
	requireNothingMore(t, msgs, 200*time.Millisecond, "delivered again")
}

// TestConcurrency: with Concurrency N, N messages are in the handler at the
// same time (none acked yet), and not N+1.
func TestConcurrency(t *testing.T) {
	t.Parallel()
	const n = 4
	topic := newQueue(t)

	cfg := testConfig()
	cfg.Concurrency = n
	pub, err := amqp.NewPublisher(context.Background(), cfg, nil)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, pub.Close()) })
	for i := range n + 2 {
		require.NoError(t, pub.Publish(topic, message.NewMessage(watermill.NewUUID(), fmt.Appendf(nil, "%d", i))))
	}

	sub := newSubscriber(t, cfg)
	msgs, err := sub.Subscribe(t.Context(), topic)
	require.NoError(t, err)

	var held []*message.Message
	for range n {
		held = append(held, receive(t, msgs, 10*time.Second))
	}
	requireNothingMore(t, msgs, 300*time.Millisecond, fmt.Sprintf("%d are unacked and the concurrency is %d", n, n))
	for _, m := range held {
		m.Ack()
	}
	for range 2 {
		receive(t, msgs, 10*time.Second).Ack()
	}
}

// TestNackDelay: a nacked message comes back, but not before NackDelay.
func TestNackDelay(t *testing.T) {
	t.Parallel()
	const delay = 400 * time.Millisecond
	topic := newQueue(t)

	cfg := testConfig()
	cfg.Concurrency = 1
	cfg.NackDelay = delay
	pub, err := amqp.NewPublisher(context.Background(), cfg, nil)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, pub.Close()) })
	require.NoError(t, pub.Publish(topic, message.NewMessage("m-1", []byte("x"))))

	sub := newSubscriber(t, cfg)
	first, msgs := testenv.SubscribeReceive(t, sub, topic, 10*time.Second)
	require.Equal(t, "m-1", first.UUID)
	nackedAt := time.Now()
	first.Nack()
	again := receive(t, msgs, 10*time.Second)
	require.GreaterOrEqual(t, time.Since(nackedAt), delay)
	require.Equal(t, "m-1", again.UUID)
	require.Equal(t, "true", again.Metadata.Get(wamqp.MetadataRedeliveredKey))
	again.Ack()
}

// TestPublishBeforeSubscribe: Publish declares the queue, so a message sent
// before any consumer exists is kept.
func TestPublishBeforeSubscribe(t *testing.T) {
	t.Parallel()
	topic := newQueue(t)

	pub, err := amqp.NewPublisher(context.Background(), testConfig(), nil)
	require.NoError(t, err)
	msg := message.NewMessage("uuid-1", []byte("early"))
	msg.Metadata.Set("event_id", "evt-early")
	msg.Metadata.Set(amqpheader.RoutingKey, "stale") // delivery metadata is not republished
	require.NoError(t, pub.Publish(topic, msg))
	require.NoError(t, pub.Close())
	require.Error(t, pub.Publish(topic, msg), "publish after close")

	sub := newSubscriber(t, testConfig())
	m, _ := testenv.SubscribeReceive(t, sub, topic, 10*time.Second)
	m.Ack()
	require.Equal(t, "uuid-1", m.UUID)
	require.Equal(t, "evt-early", m.Metadata.Get("event_id"))
	require.Equal(t, topic, m.Metadata.Get(amqpheader.RoutingKey))
	require.Equal(t, "uuid-1", m.Metadata.Get(amqpheader.MessageID))
}

// TestSubscribeContextCancel: cancelling the Subscribe context closes the
// channel, and unacked messages go back to the queue.
func TestSubscribeContextCancel(t *testing.T) {
	t.Parallel()
	topic := newQueue(t)
	cfg := testConfig()

	pub, err := amqp.NewPublisher(context.Background(), cfg, nil)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, pub.Close()) })
	require.NoError(t, pub.Publish(topic, message.NewMessage("keep-me", []byte("x"))))

	sub := newSubscriber(t, cfg)
	ctx, cancel := context.WithCancel(t.Context())
	msgs, err := sub.Subscribe(ctx, topic)
	require.NoError(t, err)
	m := receive(t, msgs, 10*time.Second)
	cancel()
	for range msgs { //nolint:revive // drain until closed
	}
	_ = m // never acked

	again, _ := testenv.SubscribeReceive(t, sub, topic, 10*time.Second)
	require.Equal(t, "keep-me", again.UUID)
	again.Ack()
}

// closedPort returns a loopback port nothing listens on (right now).
func closedPort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	return addr
}

// TestDialRetryGivesUp: nothing listens; start-up retries until DialTimeout
// and then fails with a DialError that does not print the password.
func TestDialRetryGivesUp(t *testing.T) {
	t.Parallel()
	cfg := testConfig()
	cfg.URL = "amqp://guest:s3cret-pw@" + closedPort(t) + "/"
	cfg.DialTimeout = 700 * time.Millisecond

	start := time.Now()
	_, err := amqp.NewSubscriber(context.Background(), cfg, nil)
	require.Error(t, err)
	require.GreaterOrEqual(t, time.Since(start), cfg.DialTimeout)
	var de *amqp.DialError
	require.ErrorAs(t, err, &de)
	require.Greater(t, de.Attempts, 2, "it retried")
	require.NotContains(t, err.Error(), "s3cret-pw")
	require.Contains(t, err.Error(), "guest:xxxxx@")
	require.ErrorIs(t, err, context.DeadlineExceeded)

	_, err = amqp.NewPublisher(context.Background(), cfg, nil)
	require.ErrorAs(t, err, &de)
}

// TestDialRetryWaitsForBroker: RabbitMQ "comes up" (a proxy starts
// listening) while NewSubscriber is retrying, and start-up succeeds.
func TestDialRetryWaitsForBroker(t *testing.T) {
	t.Parallel()
	addr := closedPort(t)
	cfg := testConfig()
	cfg.URL = strings.Replace(amqpURL(), "127.0.0.1:5672", addr, 1)
	require.NotEqual(t, amqpURL(), cfg.URL, "TEST_AMQP_URL must use 127.0.0.1:5672 for this test")

	var attempts atomic.Int32
	type result struct {
		sub message.Subscriber
		err error
	}
	done := make(chan result, 1)
	go func() {
		sub, err := amqp.NewSubscriber(context.Background(), cfg, countingLogger{&attempts})
		done <- result{sub, err}
	}()
	require.Eventually(t, func() bool { return attempts.Load() >= 2 }, 10*time.Second, 10*time.Millisecond)

	proxy := startProxy(t, addr, "127.0.0.1:5672")
	defer proxy.Close()
	res := <-done
	require.NoError(t, res.err)
	require.NoError(t, res.sub.Close())
}

// TestDialContextCancel: the caller's context stops the retries.
func TestDialContextCancel(t *testing.T) {
	t.Parallel()
	cfg := testConfig()
	cfg.URL = "amqp://guest:guest@" + closedPort(t) + "/"
	cfg.DialTimeout = time.Minute
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	_, err := amqp.NewSubscriber(ctx, cfg, nil)
	require.ErrorIs(t, err, context.DeadlineExceeded)
}

// TestAuthFailureNotRetried: a refused login is permanent; waiting would
// only delay the error.
func TestAuthFailureNotRetried(t *testing.T) {
	t.Parallel()
	cfg := testConfig()
	cfg.URL = strings.Replace(amqpURL(), "guest:guest@", "guest:wrong-pw@", 1)
	require.NotEqual(t, amqpURL(), cfg.URL)
	_, err := amqp.NewSubscriber(context.Background(), cfg, nil)
	var de *amqp.DialError
	require.ErrorAs(t, err, &de)
	require.Equal(t, 1, de.Attempts)
	require.NotContains(t, err.Error(), "wrong-pw")
	var aerr *amqp091.Error
	require.ErrorAs(t, err, &aerr)
	require.Equal(t, amqp091.AccessRefused, aerr.Code)
	require.ErrorAs(t, err, new(*framework.AuthError))
	require.Contains(t, err.Error(), "RabbitMQ refused the credentials (authentication failed")
}

type countingLogger struct{ n *atomic.Int32 }

func (l countingLogger) Error(string, error, watermill.LogFields) {}
func (l countingLogger) Info(msg string, _ watermill.LogFields) {
	if strings.Contains(msg, "retrying") {
		l.n.Add(1)
	}
}
func (l countingLogger) Debug(string, watermill.LogFields)                {}
func (l countingLogger) Trace(string, watermill.LogFields)                {}
func (l countingLogger) With(watermill.LogFields) watermill.LoggerAdapter { return l }

// tcpProxy forwards TCP connections from its listen address to a target
// and counts them.
type tcpProxy struct {
	l        net.Listener
	wg       sync.WaitGroup
	mu       sync.Mutex
	conns    []net.Conn
	accepted atomic.Int64 // client connections forwarded
	open     atomic.Int64 // client connections whose client has not closed yet
}

// startProxy forwards TCP connections from listen to target.
func startProxy(t *testing.T, listen, target string) *tcpProxy {
	t.Helper()
	l, err := net.Listen("tcp", listen)
	require.NoError(t, err)
	p := &tcpProxy{l: l}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			u, err := net.Dial("tcp", target)
			if err != nil {
				_ = c.Close()
				continue
			}
			p.accepted.Add(1)
			p.open.Add(1)
			p.mu.Lock()
			p.conns = append(p.conns, c, u)
			p.mu.Unlock()
			p.wg.Add(2)
			go func() { defer p.wg.Done(); _, _ = io.Copy(u, c); p.open.Add(-1); _ = u.Close() }()
			go func() { defer p.wg.Done(); _, _ = io.Copy(c, u); _ = c.Close() }()
		}
	}()
	return p
}

// URL is the suite's RabbitMQ URL through the proxy.
func (p *tcpProxy) URL() string {
	return strings.Replace(amqpURL(), "127.0.0.1:5672", p.l.Addr().String(), 1)
}

// Close stops accepting and cuts every forwarded connection.
func (p *tcpProxy) Close() error {
	err := p.l.Close()
	p.mu.Lock()
	for _, c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
	return err
}
