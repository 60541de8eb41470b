package outbox_test

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/brokers"
	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/internal/testenv"
	"github.com/claimtx/claimtx/middleware"
	"github.com/claimtx/claimtx/store"
	"github.com/claimtx/claimtx/store/outbox"
)

func TestMain(m *testing.M) {
	if os.Getenv(relayProcessEnv) != "" {
		// The relay subprocess of TestRelayKilledBetweenPublishAndMark:
		// it dies by SIGKILL, so leak checks are moot.
		os.Exit(m.Run())
	}
	testenv.VerifyTestMain(m)
}

// env is one test's world: its own schema with claimtx's tables, an
// outbox, and a downstream claimtx consumer ("downstream", keyed by the
// relay's idempotency key) whose effect is one row per message.
type env struct {
	pool   *pgxpool.Pool
	st     *store.Store
	schema string
	rec    *outcomes
	// downstream is the claim-wrapped downstream handler; call it with
	// every delivered message.
	downstream message.HandlerFunc
}

func setup(t *testing.T, maxConns int32) env {
	t.Helper()
	st := testenv.Migrated(t, maxConns)
	pool, schema := st.Pool(), st.Config().Schema
	_, err := pool.Exec(context.Background(), "CREATE TABLE IF NOT EXISTS effects (k text NOT NULL, payload text NOT NULL)")
	require.NoError(t, err)
	key, err := framework.ParseKeySpec("metadata:" + store.IdempotencyKeyMetadata)
	require.NoError(t, err)
	rec := &outcomes{}
	claim := middleware.Claim{Store: st, Consumer: "downstream", Key: key, OnOutcome: rec.add}
	effect := middleware.TxHandler(func(ctx context.Context, tx pgx.Tx, msg *message.Message) error {
		_, err := tx.Exec(ctx, "INSERT INTO effects (k, payload) VALUES ($1, $2)", msg.Metadata.Get(store.IdempotencyKeyMetadata), string(msg.Payload))
		return err
	})
	h := testenv.Install(t, middleware.NewClaim, claim)(func(msg *message.Message) ([]*message.Message, error) { return nil, effect(msg) })
	return env{pool: pool, st: st, schema: schema, rec: rec, downstream: h}
}

// enqueue commits n messages to topic in one transaction; payloads are
// "<prefix>-<i>".
func (e env) enqueue(t *testing.T, topic, prefix string, n int) {
	t.Helper()
	msgs := make([]*message.Message, n)
	for i := range msgs {
		msgs[i] = testenv.Message(fmt.Sprintf("%s-%d", prefix, i), "event_id", fmt.Sprintf("%s-%d", prefix, i))
	}
	ctx := context.Background()
	require.NoError(t, pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error { return e.st.Enqueue(ctx, tx, topic, msgs...) }))
}

func (e env) stats(t testing.TB) store.OutboxStats {
	t.Helper()
	s, err := e.st.OutboxStats(context.Background())
	require.NoError(t, err)
	return s
}

func (e env) scalar(t testing.TB, sql string, args ...any) int64 {
	t.Helper()
	return testenv.Scalar(t, e.pool, sql, args...)
}

// requireEachEffectOnce checks the downstream effect table holds exactly
// n rows, one per distinct message.
func (e env) requireEachEffectOnce(t testing.TB, n int) {
	t.Helper()
	require.Equal(t, int64(n), e.scalar(t, "SELECT count(*) FROM effects"))
	require.Equal(t, int64(n), e.scalar(t, "SELECT count(DISTINCT k) FROM effects"))
	require.Equal(t, int64(n), e.scalar(t, "SELECT count(DISTINCT payload) FROM effects"))
}

// runDownstream starts a router that hands every message on topic of the
// broker bcfg to the downstream consumer (to also first, when set), and
// returns a publisher to that broker for the relay. stop, to defer, stops
// the router and closes both ends.
func (e env) runDownstream(t *testing.T, bcfg brokers.Config, topic string, also func(*message.Message)) (pub message.Publisher, stop func()) {
	t.Helper()
	pub, err := brokers.NewPublisher(bcfg, nil)
	require.NoError(t, err)
	sub, err := brokers.NewSubscriber(bcfg, nil)
	if err != nil {
		_ = pub.Close()
		require.NoError(t, err)
	}
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, nil)
	require.NoError(t, err)
	router.AddConsumerHandler("downstream", topic, sub, func(msg *message.Message) error {
		if also != nil {
			also(msg)
		}
		_, err := e.downstream(msg)
		return err
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- router.Run(ctx) }()
	stop = func() {
		cancel()
		require.NoError(t, <-done)
		_ = sub.Close()
		_ = pub.Close()
	}
	<-router.Running()
	return pub, stop
}

// outcomes records the downstream consumer's results.
type outcomes struct {
	mu sync.Mutex
	by map[framework.Outcome]int
}

func (o *outcomes) add(r middleware.Result) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.by == nil {
		o.by = map[framework.Outcome]int{}
	}
	o.by[r.Outcome]++
}

func (o *outcomes) count(out framework.Outcome) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.by[out]
}

// applyingPublisher is a synchronous in-process broker: Publish hands each
// message to the downstream handler and returns once it was processed, like
// a publisher whose broker confirmed the message. It counts publishes per
// idempotency key and flags a key published by two relays at once.
type applyingPublisher struct {
	deliver message.HandlerFunc

	// fail, when set, runs before delivering; an error fails the Publish
	// with nothing delivered (the broker is down).
	fail func(topic string) error
	// after, when set, runs after a successful delivery, before Publish
	// returns.
	after func(topic string)

	mu        sync.Mutex
	inFlight  map[string]bool
	published map[string]int
	overlaps  int
	calls     int
	order     []string // payloads, in publish order
}

func newApplyingPublisher(deliver message.HandlerFunc) *applyingPublisher {
	return &applyingPublisher{deliver: deliver, inFlight: map[string]bool{}, published: map[string]int{}}
}

func (p *applyingPublisher) Publish(topic string, msgs ...*message.Message) error {
	if p.fail != nil {
		if err := p.fail(topic); err != nil {
			return err
		}
	}
	keys := make([]string, len(msgs))
	p.mu.Lock()
	p.calls++
	for i, m := range msgs {
		keys[i] = m.Metadata.Get(store.IdempotencyKeyMetadata)
		if p.inFlight[keys[i]] {
			p.overlaps++
		}
		p.inFlight[keys[i]] = true
	}
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		for _, k := range keys {
			delete(p.inFlight, k)
		}
		p.mu.Unlock()
	}()
	for i, m := range msgs {
		if keys[i] == "" {
			return fmt.Errorf("message %s has no idempotency key", m.UUID)
		}
		if _, err := p.deliver(m); err != nil {
			return err
		}
		p.mu.Lock()
		p.published[keys[i]]++
		p.order = append(p.order, string(m.Payload))
		p.mu.Unlock()
	}
	if p.after != nil {
		p.after(topic)
	}
	return nil
}

func (p *applyingPublisher) Close() error { return nil }

func (p *applyingPublisher) snapshot() (published map[string]int, overlaps int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[string]int, len(p.published))
	for k, v := range p.published {
		out[k] = v
	}
	return out, p.overlaps
}

// runRelay runs r until the test ends (or stop is called) and checks Run
// returned nil.
func runRelay(t *testing.T, run func(context.Context) error) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				require.NoError(t, err)
			case <-time.After(30 * time.Second):
				t.Error("relay did not stop within 30s")
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// relayConfig is cfg for a relay of these tests: behind a transaction
// pooler (make test-pgbouncer) it polls, since Run refuses LISTEN there.
func relayConfig(cfg outbox.Config) outbox.Config {
	cfg.DisableListen = cfg.DisableListen || testenv.BehindPooler()
	return cfg
}

// eventually is require.Eventually with the timings these tests use.
func eventually(t *testing.T, cond func() bool, msgAndArgs ...any) {
	t.Helper()
	require.Eventually(t, cond, 30*time.Second, 5*time.Millisecond, msgAndArgs...)
}
