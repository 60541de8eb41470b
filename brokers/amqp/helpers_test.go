package amqp_test

import (
	"context"
	"encoding/json"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/brokers"
	"github.com/claimtx/claimtx/brokers/amqp"
	"github.com/claimtx/claimtx/internal/testenv"
)

func TestMain(m *testing.M) {
	testenv.VerifyTestMain(m)
}

// amqpURL is the RabbitMQ every test shares; each test isolates itself by
// queue name.
func amqpURL() string {
	if u := os.Getenv("TEST_AMQP_URL"); u != "" {
		return u
	}
	return "amqp://guest:guest@127.0.0.1:5672/" // the adapter's default
}

// uniqueName returns a queue/topic name unique to this test and run.
func uniqueName(t *testing.T) string { return testenv.UniqueName(t, 80) }

// testConfig is a config for the shared RabbitMQ with short timings.
func testConfig() brokers.AMQPConfig {
	return brokers.AMQPConfig{
		URL:                      amqpURL(),
		NackDelay:                -1,
		DialTimeout:              10 * time.Second,
		ReconnectInitialInterval: 50 * time.Millisecond,
		ReconnectMaxInterval:     500 * time.Millisecond,
		ConnectionName:           "claimtx-brokers-amqp-test",
	}
}

// rawChannel opens a plain amqp091 connection, as a non-Watermill producer
// would, and deletes the given queues when the test ends.
func rawChannel(t *testing.T) *amqp091.Channel {
	t.Helper()
	conn, err := amqp091.Dial(amqpURL())
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	ch, err := conn.Channel()
	require.NoError(t, err)
	return ch
}

// newQueue is a queue name unique to this test, deleted when it ends.
func newQueue(t *testing.T) string {
	t.Helper()
	q := uniqueName(t)
	deleteQueuesAtCleanup(t, q)
	return q
}

// deleteQueuesAtCleanup removes queues created by a test, whatever its
// outcome.
func deleteQueuesAtCleanup(t *testing.T, names ...string) {
	t.Helper()
	t.Cleanup(func() { deleteQueues(t, names) })
}

// deleteQueues deletes the named queues, each on a channel of its own: one
// failed deletion closes its channel, not the others'.
func deleteQueues(t *testing.T, names []string) {
	conn, err := amqp091.Dial(amqpURL())
	if err != nil {
		t.Logf("cleanup: %v", err)
		return
	}
	defer conn.Close()
	for _, n := range names {
		ch, err := conn.Channel()
		if err != nil {
			return
		}
		_, _ = ch.QueueDelete(n, false, false, false)
		_ = ch.Close()
	}
}

// queueTracker records every topic a suite touches, to delete its queues.
type queueTracker struct {
	mu     sync.Mutex
	topics map[string]struct{}
}

func (q *queueTracker) add(topic string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.topics == nil {
		q.topics = make(map[string]struct{})
	}
	q.topics[topic] = struct{}{}
}

func (q *queueTracker) cleanup(t *testing.T) {
	q.mu.Lock()
	names := make([]string, 0, len(q.topics))
	for n := range q.topics {
		names = append(names, n)
	}
	q.mu.Unlock()
	deleteQueues(t, names)
}

type trackingSubscriber struct {
	*amqp.Subscriber
	q *queueTracker
}

func (s trackingSubscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	s.q.add(topic)
	return s.Subscriber.Subscribe(ctx, topic)
}

func (s trackingSubscriber) SubscribeInitialize(topic string) error {
	s.q.add(topic)
	return s.Subscriber.SubscribeInitialize(topic)
}

type trackingPublisher struct {
	*amqp.Publisher
	q *queueTracker
}

func (p trackingPublisher) Publish(topic string, msgs ...*message.Message) error {
	p.q.add(topic)
	return p.Publisher.Publish(topic, msgs...)
}

// newSubscriber returns a Subscriber closed (and checked) when the test ends.
func newSubscriber(t *testing.T, cfg brokers.AMQPConfig) *amqp.Subscriber {
	t.Helper()
	sub, err := amqp.NewSubscriber(context.Background(), cfg, nil)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, sub.Close()) })
	return sub.(*amqp.Subscriber)
}

// receiveAcked receives n messages, acks each, and returns their payloads,
// sorted.
func receiveAcked(t *testing.T, msgs <-chan *message.Message, n int) []string {
	t.Helper()
	got := make([]*message.Message, 0, n)
	for range n {
		m := receive(t, msgs, 10*time.Second)
		require.True(t, m.Ack())
		got = append(got, m)
	}
	return payloadsOf(got)
}

// receive waits for one message or fails the test.
func receive(t *testing.T, ch <-chan *message.Message, timeout time.Duration) *message.Message {
	t.Helper()
	return testenv.Receive(t, ch, timeout)
}

// onlyDeath is the one x-death entry of a dead-lettered message, which
// reaches the subscriber as JSON.
func onlyDeath(t *testing.T, m *message.Message) map[string]any {
	t.Helper()
	var xdeath []map[string]any
	require.NoError(t, json.Unmarshal([]byte(m.Metadata.Get("x-death")), &xdeath), "x-death is carried as JSON")
	require.Len(t, xdeath, 1)
	return xdeath[0]
}
