package consumer_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/brokers"
	_ "github.com/claimtx/claimtx/brokers/amqp" // registers the kind
	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/framework/consumer"
	"github.com/claimtx/claimtx/internal/testenv"
	"github.com/claimtx/claimtx/middleware"
)

// The consumer on RabbitMQ quorum queues (brokers.AMQPConfig.QueueType "quorum"):
// the same failure policy as on classic queues, twins, the poison queue,
// and what the queue's delivery limit does next to claimtx's own poison
// path.

// quorumArgs are the queue arguments the adapter declares for a quorum
// queue with delivery limit limit and the extra arguments extra.
func quorumArgs(limit int, extra map[string]any) amqp091.Table {
	args := amqp091.Table{"x-queue-type": "quorum"}
	if limit > 0 {
		args["x-delivery-limit"] = int64(limit)
	}
	for k, v := range extra {
		args[k] = v
	}
	return args
}

// newQuorumRawBroker is newRawBroker("amqp") on quorum queues with
// delivery limit limit and the queue arguments extra: the topic's queue is
// declared before the consumer starts, as an operator would.
func newQuorumRawBroker(t *testing.T, topic string, limit int, extra map[string]any) *rawBroker {
	t.Helper()
	rb := &rawBroker{kind: brokers.KindAMQP, topic: topic, amqpConn: amqpQueue(t, topic, quorumArgs(limit, extra))}
	rb.cfg = brokers.Config{Kind: brokers.KindAMQP, AMQP: brokers.AMQPConfig{
		Concurrency: 2, NackDelay: 50 * time.Millisecond,
		QueueType: "quorum", DeliveryLimit: limit, QueueArguments: extra,
	}}
	return rb
}

// requireQuorumQueue checks that queue exists as a quorum queue with
// delivery limit limit and the arguments extra, by redeclaring it
// (RabbitMQ refuses a redeclaration with other arguments).
func requireQuorumQueue(t *testing.T, conn *amqp091.Connection, queue string, limit int, extra map[string]any) {
	t.Helper()
	ch, err := conn.Channel()
	require.NoError(t, err)
	_, err = ch.QueueDeclare(queue, true, false, false, false, quorumArgs(limit, extra))
	require.NoError(t, err, "%s is a quorum queue with the consumer's arguments", queue)
	_ = ch.Close()
}

// TestFailurePolicyOnQuorumQueues runs the failure policy scenarios
// (applied, duplicates, permanent error, transient error redelivered after
// a nack, panic, error then success, error every time) on a quorum queue
// with a delivery limit, in both modes: they end exactly as on a classic
// queue, and the poison queue is a quorum queue with the same arguments.
func TestFailurePolicyOnQuorumQueues(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"message", "batch"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			pool, schema, _, _ := effectsDB(t, 8, "order_id bigint NOT NULL")
			topic := "quorum-policy-" + mode + "-" + randHex()
			rb := newQuorumRawBroker(t, topic, 5, nil)
			runFailurePolicy(t, mode, pool, schema, topic, rb)
			requireQuorumQueue(t, rb.amqpConn, topic+poisonSuffix, 5, nil)
		})
	}
}

// TestQuorumPoisonQueueDeclaredAtStart: the consumer declares the poison
// queue with the topic's type when it starts, so a poison queue left with
// other arguments (a classic one from before the move to quorum) fails
// consumer.New with the reason and the way out, instead of failing the
// first poisoning.
func TestQuorumPoisonQueueDeclaredAtStart(t *testing.T) {
	t.Parallel()
	pool, schema := testenv.Setup(t, 2)
	topic := "quorum-start-" + randHex()
	rb := newQuorumRawBroker(t, topic, 0, nil)
	cfg := baseConfig("quorum", topic, pool, schema, rb.cfg)
	c, err := consumer.New(t.Context(), cfg, noop)
	require.NoError(t, err)
	requireQuorumQueue(t, rb.amqpConn, topic+poisonSuffix, 0, nil)
	_, stop := start(c)
	require.NoError(t, stop())
	requireQuorumQueue(t, rb.amqpConn, topic+poisonSuffix, 0, nil)

	// A classic poison queue next to a quorum topic queue.
	other := "quorum-start-" + randHex()
	rb2 := newQuorumRawBroker(t, other, 0, nil)
	ch, err := rb2.amqpConn.Channel()
	require.NoError(t, err)
	_, err = ch.QueueDeclare(other+poisonSuffix, true, false, false, false, nil)
	require.NoError(t, err)
	require.NoError(t, ch.Close())
	cfg.Topic, cfg.Broker = other, rb2.cfg
	_, err = consumer.New(t.Context(), cfg, noop)
	ce := requireConfigError(t, err, "queue_type")
	require.Contains(t, ce.Reason, "rabbitmqctl delete_queue "+other+poisonSuffix)
}

// TestQuorumTwins: two copies of one order delivered at once from a
// quorum queue to two subscriptions: the second claim waits behind the
// first's uncommitted claim and becomes a duplicate when it commits.
func TestQuorumTwins(t *testing.T) {
	t.Parallel()
	pool, schema, _, _ := effectsDB(t, 8, "order_id bigint NOT NULL")
	topic := "quorum-twins-" + randHex()
	rb := newQuorumRawBroker(t, topic, 0, nil)

	entered, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	var mu sync.Mutex
	var results []middleware.Result
	cfg := baseConfig("quorum", topic, pool, schema, rb.cfg)
	cfg.OnOutcome = func(r middleware.Result) {
		mu.Lock()
		defer mu.Unlock()
		results = append(results, r)
	}
	c, err := consumer.New(t.Context(), cfg, func(ctx context.Context, tx pgx.Tx, msg *message.Message) error {
		if _, err := insertOrder(ctx, tx, msg); err != nil {
			return err
		}
		once.Do(func() { close(entered) })
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})
	require.NoError(t, err)
	_, stop := start(c)
	defer func() { require.NoError(t, stop()) }()

	for i := range 2 {
		rb.publish(t, badRow{eventID: "order-1", payload: mustJSON(policyOrder{OrderID: 1})}, fmt.Sprint("copy-", i))
	}
	<-entered
	// The twin's claim waits on the first one's row lock.
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, pool.QueryRow(t.Context(), `SELECT count(*) FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND query LIKE '%' || $1 || '%'`, schema).Scan(&n))
		return n == 1
	}, 30*time.Second, 10*time.Millisecond, "the twin waits on the claim")
	close(release)

	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(results) == 2
	}, 30*time.Second, 10*time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	outcomes := map[framework.Outcome]middleware.Result{}
	for _, r := range results {
		outcomes[r.Outcome] = r
	}
	require.Contains(t, outcomes, framework.Applied)
	require.Contains(t, outcomes, framework.Duplicate)
	require.Positive(t, outcomes[framework.Duplicate].ClaimWait)
	n := queryInt(t, pool, "SELECT count(*) FROM effects")
	require.Equal(t, 1, n)
}

// TestQuorumPoisonActsBeforeDeliveryLimit: with the lowest delivery limit
// (1), claimtx's poison path still settles a failing message on its first
// delivery: HandlerRetries runs in process, then the message is poisoned
// with the reason, so the queue's limit never comes into play. What does
// reach it is a message nacked again and again (a transient database
// failure that outlasts the claim's retries, up to RabbitMQ 4.2): RabbitMQ
// then dead-letters it (reason delivery_limit) to the queue the operator
// configured, and replaying that queue applies it once, keyed as before.
func TestQuorumPoisonActsBeforeDeliveryLimit(t *testing.T) {
	t.Parallel()
	pool, schema, _, _ := effectsDB(t, 8, "order_id bigint NOT NULL")
	topic := "quorum-limit-" + randHex()
	dlq := topic + ".dlq"
	dl := map[string]any{"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq}
	rb := newQuorumRawBroker(t, topic, 1, dl)
	dlqRB := newQuorumRawBroker(t, dlq, 0, nil)

	var mu sync.Mutex
	seen := map[int64][]string{} // x-delivery-count of every handler call, per order
	handler := func(ctx context.Context, tx pgx.Tx, msg *message.Message) error {
		var o policyOrder
		if err := json.Unmarshal(msg.Payload, &o); err != nil {
			return framework.Permanent(err)
		}
		count := msg.Metadata.Get("x-delivery-count")
		if count == "" {
			count = "0" // a first delivery may come without the header
		}
		mu.Lock()
		seen[o.OrderID] = append(seen[o.OrderID], count)
		mu.Unlock()
		switch {
		case o.Do == "error":
			return fmt.Errorf("order %d still failing", o.OrderID)
		case o.Do == "transient" && msg.Metadata.Get("x-death") == "":
			// Every attempt on the work queue: the claim retries it, then
			// the message is nacked.
			return &pgconn.PgError{Code: "40001", Message: "could not serialize access"}
		}
		_, err := insertOrder(ctx, tx, msg)
		return err
	}
	cfg := baseConfig("quorum", topic, pool, schema, rb.cfg)
	cfg.Key, cfg.Claim.MaxAttempts, cfg.RetryInitialInterval = "template:order:{metadata.event_id}", 2, 5*time.Millisecond
	c, err := consumer.New(t.Context(), cfg, handler)
	require.NoError(t, err)
	_, stop := start(c)
	rb.publish(t, badRow{eventID: "order-1", payload: mustJSON(policyOrder{OrderID: 1, Do: "error"})}, "error")
	rb.publish(t, badRow{eventID: "order-2", payload: mustJSON(policyOrder{OrderID: 2, Do: "transient"})}, "transient")

	// Order 1: poisoned by claimtx, with the reason, after 1+3 calls in
	// its one delivery (x-delivery-count 0 each time).
	poisoned := rb.poisoned(t, 1)
	require.Contains(t, poisoned["error"].reason, "still failing")
	mu.Lock()
	require.Equal(t, []string{"0", "0", "0", "0"}, seen[1], "HandlerRetries 3, all in the first delivery")
	mu.Unlock()

	// Order 2: nacked twice (x-delivery-count 0, then 1), then the limit
	// of 1 is passed and RabbitMQ dead-letters it.
	require.Eventually(t, func() bool { return rb.queueDepth(t, dlq) == 1 }, 30*time.Second, 10*time.Millisecond, "dead-lettered")
	require.NoError(t, stop())
	mu.Lock()
	require.Equal(t, []string{"0", "0", "1", "1"}, seen[2], "two deliveries of MaxAttempts 2 claims each, then the limit")
	mu.Unlock()
	require.Zero(t, rb.queueDepth(t, topic))

	// Replaying the dead-letter queue applies it, once, under the same key.
	cfg.Topic, cfg.Broker = dlq, dlqRB.cfg
	replay, err := consumer.New(t.Context(), cfg, handler)
	require.NoError(t, err)
	_, stopReplay := start(replay)
	defer func() { require.NoError(t, stopReplay()) }()
	require.Eventually(t, func() bool {
		return queryInt(t, pool, "SELECT count(*) FROM effects WHERE order_id = 2") == 1
	}, 30*time.Second, 10*time.Millisecond, "replayed from the dead-letter queue")
	var key string
	require.NoError(t, pool.QueryRow(t.Context(), fmt.Sprintf("SELECT message_key FROM %s.processed_messages", pgx.Identifier{schema}.Sanitize())).Scan(&key))
	require.Equal(t, "order:order-2", key, "x-death and x-delivery-count never reach the key")
}
