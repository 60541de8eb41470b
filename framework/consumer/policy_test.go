package consumer_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/claimtx/claimtx/brokers"
	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/framework/consumer"
	"github.com/claimtx/claimtx/internal/testenv"
	"github.com/claimtx/claimtx/middleware"
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

// policyConfig is the consumer of the failure policy tests: bounded claim
// attempts and handler retries, retried at once.
func policyConfig(name, topic string, pool *pgxpool.Pool, schema string, rb *rawBroker) consumer.Config {
	cfg := baseConfig(name, topic, pool, schema, rb.cfg)
	cfg.Claim.MaxAttempts, cfg.HandlerRetries = policyMaxAttempts, policyHandlerRetries
	cfg.RetryInitialInterval = 5 * time.Millisecond
	return cfg
}

// runFailurePolicy runs the scenarios through the consumer of mode on
// topic, published and read back through rb.
func runFailurePolicy(t *testing.T, mode string, pool *pgxpool.Pool, schema, topic string, rb *rawBroker) {
	h := newPolicyHandler()
	c := newModeConsumer(t, mode, policyConfig("policy", topic, pool, schema, rb), h.apply, perMessage(h.apply))
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
		return queryInt(t, pool, "SELECT count(*) FROM effects") == wantApplied
	}, 60*time.Second, 20*time.Millisecond, "applied orders")
	require.NoError(t, stop())

	for i, s := range scenarios {
		id := int64(i + 1)
		n := queryInt(t, pool, "SELECT count(*) FROM effects WHERE order_id = $1", id)
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
	cfg := baseConfig("shutdown", topic, pool, schema, rb.cfg)
	cfg.DrainTimeout = 30 * time.Second
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
		k := queryInt(t, pool, "SELECT count(*) FROM effects WHERE order_id = $1", id)
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
		return queryInt(t, pool, "SELECT count(DISTINCT order_id) FROM effects") == n
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
	c, err := consumer.New(t.Context(), baseConfig("stuck", "orders", pool, schema, brokers.Config{Kind: kind}), noop)
	require.NoError(t, err)
	cancel, wait := start(c)
	<-c.Running()
	cancel()
	require.NoError(t, wait(), "a slow-closing subscription failed the shutdown")
}

// A consumer stopped while it is still subscribing (a SIGTERM right after
// start, in a rolling deploy) stops at once and cleanly. Watermill's router
// counts a handler from the moment it is added, so a router closed before
// its handler started waited out its whole close timeout (5 s) and the
// shutdown logged a subscription that "did not close in time".
func TestStopWhileStarting(t *testing.T) {
	t.Parallel()
	forEachBrokerAndMode(t, func(t *testing.T, kind, mode string) {
		pool, schema := testenv.Setup(t, 2)
		topic := "startstop-" + randHex()
		rb := newRawBroker(t, kind, topic)
		var logs bytes.Buffer
		cfg := baseConfig("startstop", topic, pool, schema, rb.cfg)
		cfg.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
		c := newModeConsumer(t, mode, cfg, noop, perMessage(noop))
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		require.NoError(t, c.Run(ctx))
		require.NoError(t, c.Close())
		require.NotContains(t, logs.String(), "did not close in time")
	})
}

// claimtx_messages_total is a count of messages: dashboards divide by it.
// Each delivery that is acked or nacked must add exactly one outcome to it
// (and one call of Config.OnOutcome), however often it was retried in
// process on the way; retries are counted in claimtx_retries_total.
func TestOneOutcomePerMessage(t *testing.T) {
	t.Parallel()
	forEachBrokerAndMode(t, testOneOutcomePerMessage)
}

func testOneOutcomePerMessage(t *testing.T, kind, mode string) {
	pool, schema, topic, rb := effectsFixture(t, kind, "outcomes-"+mode)
	h := newPolicyHandler()
	reg := prometheus.NewRegistry()
	var mu sync.Mutex
	hooked := map[framework.Outcome]int{}
	cfg := policyConfig("outcomes", topic, pool, schema, rb)
	cfg.Registerer = reg
	cfg.OnOutcome = func(r middleware.Result) {
		mu.Lock()
		defer mu.Unlock()
		hooked[r.Outcome]++
	}
	c := newModeConsumer(t, mode, cfg, h.apply, perMessage(h.apply))

	// Every series exists, at zero, before the first message.
	before := gather(t, reg)
	for _, o := range []framework.Outcome{framework.Applied, framework.Duplicate, framework.Failed, framework.Poisoned, framework.Expired} {
		require.Contains(t, before, `claimtx_messages_total{outcome="`+string(o)+`"}`)
	}
	for _, cause := range []string{"serialization", "deadlock", "claim_wait", "connection", "handler"} {
		require.Contains(t, before, `claimtx_retries_total{cause="`+cause+`"}`)
	}
	require.Contains(t, before, `claimtx_fingerprint_mismatch_total{}`)

	_, stop := start(c)
	defer func() { require.NoError(t, stop()) }()

	id := int64(0)
	publish := func(do string, copies int) {
		id++
		for range copies {
			rb.publish(t, badRow{eventID: fmt.Sprintf("order-%d", id), payload: mustJSON(policyOrder{OrderID: id, Do: do})}, do)
		}
	}
	settled := func(applied, poisoned, outcomes int) {
		t.Helper()
		require.Eventually(t, func() bool {
			n := queryInt(t, pool, "SELECT count(*) FROM effects")
			sum := 0
			for k, v := range gather(t, reg) {
				if strings.HasPrefix(k, "claimtx_messages_total{") {
					sum += int(v)
				}
			}
			return n == applied && rb.poisonCount(t) == poisoned && sum >= outcomes
		}, 60*time.Second, 20*time.Millisecond, "messages settled")
	}
	publish("ok", 1)        // applied
	publish("ok", 3)        // applied once, two duplicates
	publish("permanent", 1) // poisoned at once
	publish("error", 1)     // retried HandlerRetries times, then poisoned
	settled(2, 2, 6)
	// A transient failure alone: in batch mode it fails its whole batch,
	// so neighbours would be nacked along with it. Its first two
	// deliveries fail (the claim retries each once), the third applies.
	publish("transient", 1)
	settled(3, 2, 9)
	require.NoError(t, stop())

	got := gather(t, reg)
	count := func(o framework.Outcome) int { return int(got[`claimtx_messages_total{outcome="`+string(o)+`"}`]) }
	want := map[framework.Outcome]int{
		framework.Applied: 3, framework.Duplicate: 2, framework.Poisoned: 2, framework.Failed: 2, framework.Expired: 0,
	}
	for o, n := range want {
		require.Equal(t, n, count(o), "claimtx_messages_total{outcome=%q}", o)
	}
	mu.Lock()
	for o, n := range want {
		require.Equal(t, n, hooked[o], "Config.OnOutcome calls with outcome %q", o)
	}
	mu.Unlock()
	require.Equal(t, float64(policyHandlerRetries), got[`claimtx_retries_total{cause="handler"}`], "handler retries")
	// One claim retry in each of the two failed deliveries.
	require.Equal(t, float64(2), got[`claimtx_retries_total{cause="serialization"}`], "claim retries")

	if mode == "message" {
		// Watermill's router metrics carry claimtx's prefix too.
		var names []string
		mfs, err := reg.Gather()
		require.NoError(t, err)
		for _, mf := range mfs {
			names = append(names, mf.GetName())
			require.True(t, strings.HasPrefix(mf.GetName(), "claimtx_"), "unprefixed metric %s", mf.GetName())
		}
		require.Contains(t, names, "claimtx_handler_execution_time_seconds")
	}
}

// gather flattens reg's counters and histogram counts to
// name{label="value"} → value, leaving out the consumer and handler labels
// (one consumer per registry here).
func gather(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	out := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			var labels []string
			for _, lp := range m.GetLabel() {
				switch lp.GetName() {
				case "consumer", "handler":
				default:
					labels = append(labels, fmt.Sprintf("%s=%q", lp.GetName(), lp.GetValue()))
				}
			}
			key := mf.GetName() + "{" + strings.Join(labels, ",") + "}"
			switch mf.GetType() {
			case dto.MetricType_COUNTER:
				out[key] += m.GetCounter().GetValue()
			case dto.MetricType_HISTOGRAM:
				out[key] += float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return out
}
