package consumer_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/claimtx/claimtx/brokers"
	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/framework/consumer"
	"github.com/claimtx/claimtx/internal/testenv"
	"github.com/claimtx/claimtx/middleware"
	"github.com/claimtx/claimtx/store"
)

// The failure policy is one policy for both consumer modes. Each
// scenario is one order whose payload tells the handler how to behave;
// the same table runs through the per-message and the batch consumer, on
// RabbitMQ and on Kafka, and must end the same way.

// poisonSuffix makes the default Config.PoisonTopic from Topic.
const poisonSuffix = ".poison"

const (
	policyMaxAttempts    = 2 // claim attempts for transient failures
	policyHandlerRetries = 2 // in-process retries of handler failures
)

// policyOrder is the scenario's message.
type policyOrder struct {
	OrderID int64  `json:"order_id"`
	Do      string `json:"do"`
}

type policyScenario struct {
	name   string
	do     string
	copies int // deliveries published (same event id)
	// applied: the effect must commit exactly once; otherwise the message
	// must be poisoned (exactly once) with a reason containing reason.
	applied bool
	reason  string
}

func policyScenarios() []policyScenario {
	return []policyScenario{
		{name: "applied", do: "ok", copies: 1, applied: true},
		{name: "duplicate", do: "ok", copies: 3, applied: true},
		{name: "permanent error", do: "permanent", copies: 1, reason: "refused for good"},
		// Every attempt of the first two deliveries fails with a
		// serialization failure: the claim retries it, nothing above
		// retries it again, it is nacked (never poisoned) and applied on
		// the third delivery.
		{name: "transient error", do: "transient", copies: 1, applied: true},
		{name: "panic", do: "panic", copies: 1, reason: "panicked"},
		{name: "error then success", do: "errfirst", copies: 1, applied: true},
		{name: "error every time", do: "error", copies: 1, reason: "still failing"},
	}
}

// policyHandler records, per order, how often it ran and in which
// delivery (a broker delivery is a new *message.Message; in-process
// retries reuse it).
type policyHandler struct {
	mu         sync.Mutex
	calls      map[int64]int
	deliveries map[int64][]*message.Message
	perDeliv   map[*message.Message]int
}

func newPolicyHandler() *policyHandler {
	return &policyHandler{calls: map[int64]int{}, deliveries: map[int64][]*message.Message{}, perDeliv: map[*message.Message]int{}}
}

func (h *policyHandler) record(id int64, msg *message.Message) (call, delivery int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.calls[id]++
	if h.perDeliv[msg] == 0 {
		h.deliveries[id] = append(h.deliveries[id], msg)
	}
	h.perDeliv[msg]++
	return h.calls[id], len(h.deliveries[id])
}

// firstDeliveryCalls is how often the handler ran for the first delivery
// of order id.
func (h *policyHandler) firstDeliveryCalls(id int64) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.deliveries[id]) == 0 {
		return 0
	}
	return h.perDeliv[h.deliveries[id][0]]
}

func (h *policyHandler) apply(ctx context.Context, tx pgx.Tx, msg *message.Message) error {
	var o policyOrder
	if err := json.Unmarshal(msg.Payload, &o); err != nil {
		return framework.Permanent(err)
	}
	call, delivery := h.record(o.OrderID, msg)
	switch o.Do {
	case "permanent":
		return framework.Permanent(fmt.Errorf("order %d refused for good", o.OrderID))
	case "transient":
		if delivery <= 2 {
			return fmt.Errorf("order %d: %w", o.OrderID, &pgconn.PgError{Code: "40001", Message: "could not serialize access"})
		}
	case "panic":
		panic(fmt.Sprintf("order %d", o.OrderID))
	case "errfirst":
		if call == 1 {
			return fmt.Errorf("order %d: first call fails", o.OrderID)
		}
	case "error":
		return fmt.Errorf("order %d still failing", o.OrderID)
	}
	_, err := tx.Exec(ctx, "INSERT INTO effects (order_id) VALUES ($1)", o.OrderID)
	return err
}

type runner interface {
	Run(context.Context) error
	Close() error
}

// newModeConsumer builds the per-message ("message") or batch consumer
// over handler h.
func newModeConsumer(t *testing.T, mode string, cfg consumer.Config, apply middleware.TxHandlerFunc, applySet middleware.SetHandlerFunc) runner {
	t.Helper()
	if mode == "batch" {
		cfg.Broker.AMQP.Window, cfg.Broker.Kafka.Window = 32, 32
		c, err := consumer.NewBatch(t.Context(), cfg, applySet, consumer.BatchOptions{MaxSize: 16, Workers: 2})
		require.NoError(t, err)
		return c
	}
	c, err := consumer.New(t.Context(), cfg, apply)
	require.NoError(t, err)
	return c
}

// start runs c. cancel ends Run's context, as SIGTERM does the loyalty
// example's; wait then returns Run's error and closes c.
func start(c runner) (cancel func(), wait func() error) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	var once sync.Once
	var err error
	return cancel, func() error {
		once.Do(func() {
			cancel()
			err = <-done
			if cerr := c.Close(); err == nil {
				err = cerr
			}
		})
		return err
	}
}

func forEachBrokerAndMode(t *testing.T, f func(t *testing.T, kind, mode string)) {
	for _, kind := range []string{brokers.KindAMQP, brokers.KindKafka} {
		for _, mode := range []string{"message", "batch"} {
			t.Run(kind+"/"+mode, func(t *testing.T) {
				t.Parallel()
				f(t, kind, mode)
			})
		}
	}
}

func TestFailurePolicySameInBothModes(t *testing.T) {
	t.Parallel()
	forEachBrokerAndMode(t, testFailurePolicy)
}

// effectsFixture is what each broker × mode test starts from: its own
// schema with an effects table, and its own topic on a plain broker client.
func effectsFixture(t *testing.T, kind, prefix string) (pool *pgxpool.Pool, schema, topic string, rb *rawBroker) {
	t.Helper()
	pool, schema, _, _ = effectsDB(t, 8, "order_id bigint NOT NULL")
	topic = prefix + "-" + randHex()
	return pool, schema, topic, newRawBroker(t, kind, topic)
}

func testFailurePolicy(t *testing.T, kind, mode string) {
	pool, schema, topic, rb := effectsFixture(t, kind, "policy-"+mode)
	runFailurePolicy(t, mode, pool, schema, topic, rb)
}

// runFailurePolicy runs the scenarios through the consumer of mode on
// topic, published and read back through rb.
func runFailurePolicy(t *testing.T, mode string, pool *pgxpool.Pool, schema, topic string, rb *rawBroker) {
	h := newPolicyHandler()
	c := newModeConsumer(t, mode, consumer.Config{
		Name: "policy", Topic: topic, Key: "metadata:event_id", Pool: pool,
		Store: store.Config{Schema: schema}, Broker: rb.cfg,
		Claim: middleware.Claim{MaxAttempts: policyMaxAttempts}, HandlerRetries: policyHandlerRetries,
		RetryInitialInterval: 5 * time.Millisecond, Logger: slog.New(slog.DiscardHandler),
	}, h.apply, perMessage(h.apply))
	_, stop := start(c)
	defer func() { require.NoError(t, stop()) }()

	scenarios := policyScenarios()
	wantApplied, wantPoisoned := 0, 0
	for i, s := range scenarios {
		id := int64(i + 1)
		for range s.copies {
			rb.publish(t, badRow{eventID: fmt.Sprintf("order-%d", id), payload: mustJSON(policyOrder{OrderID: id, Do: s.do})}, s.name)
		}
		if s.applied {
			wantApplied++
		} else {
			wantPoisoned++
		}
	}

	poisoned := rb.poisoned(t, wantPoisoned)
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, pool.QueryRow(t.Context(), "SELECT count(*) FROM effects").Scan(&n))
		return n == wantApplied
	}, 60*time.Second, 20*time.Millisecond, "applied orders")
	require.NoError(t, stop())

	for i, s := range scenarios {
		id := int64(i + 1)
		var n int
		require.NoError(t, pool.QueryRow(t.Context(), "SELECT count(*) FROM effects WHERE order_id = $1", id).Scan(&n))
		if s.applied {
			require.Equal(t, 1, n, "%s: effect count", s.name)
			require.NotContains(t, poisoned, s.name, "%s: a message that was applied was poisoned", s.name)
			continue
		}
		require.Zero(t, n, "%s: a poisoned message left an effect", s.name)
		require.Contains(t, poisoned, s.name, "%s: not poisoned", s.name)
		require.Contains(t, poisoned[s.name].reason, s.reason, "%s: poison reason", s.name)
	}
	total := rb.poisonCount(t)
	if rb.kind == brokers.KindAMQP {
		total += len(poisoned) // read off the queue by rb.poisoned
	}
	require.Equal(t, wantPoisoned, total, "the poison destination holds exactly the failed scenarios")

	// Bounded retries: a handler that always fails ran once plus
	// HandlerRetries times in its delivery, then was poisoned.
	for i, s := range scenarios {
		if s.do == "error" || s.do == "panic" {
			require.GreaterOrEqual(t, h.firstDeliveryCalls(int64(i+1)), 1+policyHandlerRetries, "%s: retries", s.name)
		}
		if s.do == "transient" && mode == "message" {
			// Retried by the claim only: MaxAttempts transactions per
			// delivery, not MaxAttempts × (1 + HandlerRetries).
			require.Equal(t, policyMaxAttempts, h.firstDeliveryCalls(int64(i+1)), "%s: attempts in one delivery", s.name)
		}
	}
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}

// poisonCount is how many messages the poison destination holds now
// (RabbitMQ: ready in the queue; Kafka: records in the topic).
func (rb *rawBroker) poisonCount(t *testing.T) int {
	t.Helper()
	dest := rb.topic + poisonSuffix
	switch rb.kind {
	case "amqp":
		return rb.queueDepth(t, dest)
	default:
		adm := kadm.NewClient(rb.kcl)
		ends, err := adm.ListEndOffsets(t.Context(), dest)
		require.NoError(t, err)
		n := 0
		ends.Each(func(o kadm.ListedOffset) { n += int(o.Offset) })
		return n
	}
}

// queueDepth is the number of ready messages in an AMQP queue (0 when it
// does not exist).
func (rb *rawBroker) queueDepth(t *testing.T, queue string) int {
	t.Helper()
	ch, err := rb.amqpConn.Channel()
	require.NoError(t, err)
	defer func() { _ = ch.Close() }()
	q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	if err != nil {
		return 0 // 404: the consumer never declared it
	}
	return q.Messages
}

// A rolling deploy: the consumer is told to stop (its Run context ends, as
// SIGTERM does to the loyalty example) while a message is in flight.
func TestShutdownDrainsInFlightWork(t *testing.T) {
	t.Parallel()
	forEachBrokerAndMode(t, func(t *testing.T, kind, mode string) {
		t.Run("finishes within the drain timeout", func(t *testing.T) { testShutdown(t, kind, mode, false) })
		t.Run("cut off by the drain timeout", func(t *testing.T) { testShutdown(t, kind, mode, true) })
	})
}

// testShutdown publishes orders 1..n; the handler holds order 1 open
// inside its claim transaction until the test has asked the consumer to
// stop. With cutOff the handler waits for its context instead and the
// drain timeout must end it. Either way nothing is poisoned, and after a
// restart every order is applied exactly once.
func testShutdown(t *testing.T, kind, mode string, cutOff bool) {
	const n = 6
	pool, schema, topic, rb := effectsFixture(t, kind, "shutdown-"+mode)

	entered, release := make(chan struct{}), make(chan struct{})
	var enterOnce sync.Once
	apply := func(ctx context.Context, tx pgx.Tx, msg *message.Message) error {
		o, err := insertOrder(ctx, tx, msg)
		if err != nil || o.Do != "hold" {
			return err
		}
		enterOnce.Do(func() { close(entered) })
		if cutOff {
			<-ctx.Done() // stuck in a call that honours its context
			return ctx.Err()
		}
		<-release
		return nil
	}
	cfg := consumer.Config{
		Name: "shutdown", Topic: topic, Key: "metadata:event_id", Pool: pool,
		Store: store.Config{Schema: schema}, Broker: rb.cfg,
		Logger: slog.New(slog.DiscardHandler), DrainTimeout: 30 * time.Second,
	}
	if cutOff {
		cfg.DrainTimeout = 300 * time.Millisecond
	}
	c := newModeConsumer(t, mode, cfg, apply, perMessage(apply))
	cancel, stop := start(c)
	for i := int64(1); i <= n; i++ {
		do := "ok"
		if i == 1 {
			do = "hold"
		}
		rb.publish(t, badRow{eventID: fmt.Sprintf("order-%d", i), payload: mustJSON(policyOrder{OrderID: i, Do: do})}, fmt.Sprint(i))
	}
	select {
	case <-entered:
	case <-time.After(60 * time.Second):
		t.Fatal("order 1 never reached the handler")
	}
	cancel()
	if !cutOff {
		// Run's context has ended: a shutdown that cancels the work in
		// flight has done so already, and this commit must still go
		// through.
		close(release)
	}
	stopped := make(chan error, 1)
	go func() { stopped <- stop() }()
	select {
	case err := <-stopped:
		require.NoError(t, err)
	case <-time.After(60 * time.Second):
		t.Fatal("the consumer did not stop")
	}
	count := func(id int64) int {
		var k int
		require.NoError(t, pool.QueryRow(t.Context(), "SELECT count(*) FROM effects WHERE order_id = $1", id).Scan(&k))
		return k
	}
	if cutOff {
		require.Zero(t, count(1), "work cut off by the drain timeout must roll back")
	} else {
		require.Equal(t, 1, count(1), "work in flight at shutdown must be allowed to commit")
		if kind == brokers.KindAMQP && mode == "message" {
			// ... and to be acked: only what never started is back in
			// the queue.
			require.Less(t, rb.queueDepth(t, topic), n, "nothing was acked during the drain")
		}
	}
	require.Zero(t, rb.poisonCount(t), "shutdown poisoned a valid message")

	// The next replica applies everything that was not acked, once.
	plain := func(ctx context.Context, tx pgx.Tx, msg *message.Message) error {
		_, err := insertOrder(ctx, tx, msg)
		return err
	}
	_, stop2 := start(newModeConsumer(t, mode, cfg, plain, perMessage(plain)))
	require.Eventually(t, func() bool {
		var k int
		require.NoError(t, pool.QueryRow(t.Context(), "SELECT count(DISTINCT order_id) FROM effects").Scan(&k))
		return k == n
	}, 60*time.Second, 20*time.Millisecond, "orders applied after the restart")
	require.NoError(t, stop2())
	for i := int64(1); i <= n; i++ {
		require.Equal(t, 1, count(i), "order %d", i)
	}
	require.Zero(t, rb.poisonCount(t), "shutdown poisoned a valid message")
}

// insertOrder decodes msg and writes its effect.
func insertOrder(ctx context.Context, tx pgx.Tx, msg *message.Message) (policyOrder, error) {
	var o policyOrder
	if err := json.Unmarshal(msg.Payload, &o); err != nil {
		return o, framework.Permanent(err)
	}
	_, err := tx.Exec(ctx, "INSERT INTO effects (order_id) VALUES ($1)", o.OrderID)
	return o, err
}

// perMessage turns a per-message handler into a set handler that applies
// the set one message at a time.
func perMessage(h middleware.TxHandlerFunc) middleware.SetHandlerFunc {
	return func(ctx context.Context, tx pgx.Tx, msgs []*message.Message) error {
		for _, m := range msgs {
			if err := h(ctx, tx, m); err != nil {
				return err
			}
		}
		return nil
	}
}

// stuckSubscriber delivers nothing and never ends its subscriptions: a
// Kafka client blocked on a dead broker connection until its read timeout
// behaves like this at shutdown.
// Its subscriptions end when release is closed, at the end of the test.
type stuckSubscriber struct{ release chan struct{} }

func (s stuckSubscriber) Subscribe(context.Context, string) (<-chan *message.Message, error) {
	ch := make(chan *message.Message)
	go func() {
		<-s.release
		close(ch)
	}()
	return ch, nil
}

func (s stuckSubscriber) Close() error { return nil }

type nopPublisher struct{}

func (nopPublisher) Publish(string, ...*message.Message) error { return nil }
func (nopPublisher) Close() error                              { return nil }

// A subscription that does not end in time must not turn a graceful
// shutdown into a failure (exit status 1 in the loyalty example): every
// message has been settled or handed back by then.
func TestShutdownWithAStuckSubscription(t *testing.T) {
	t.Parallel()
	kind := "stuck" + randHex()[:8]
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	brokers.Register(kind, brokers.Factory{
		NewSubscriber: func(brokers.Config, watermill.LoggerAdapter) (message.Subscriber, error) {
			return stuckSubscriber{release}, nil
		},
		NewPublisher: func(brokers.Config, watermill.LoggerAdapter) (message.Publisher, error) {
			return nopPublisher{}, nil
		},
	})
	pool, schema := testenv.Setup(t, 2)
	bcfg := brokers.Config{}
	bcfg.Kind = kind
	c, err := consumer.New(t.Context(), consumer.Config{
		Name: "stuck", Topic: "orders", Key: "metadata:event_id", Pool: pool,
		Store: store.Config{Schema: schema}, Broker: bcfg, Logger: slog.New(slog.DiscardHandler),
	}, func(context.Context, pgx.Tx, *message.Message) error { return nil })
	require.NoError(t, err)
	cancel, wait := start(c)
	<-c.Running()
	cancel()
	require.NoError(t, wait(), "a slow-closing subscription failed the shutdown")
}
