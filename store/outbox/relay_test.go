package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/brokers"
	_ "github.com/claimtx/claimtx/brokers/amqp"  // registers the kind
	_ "github.com/claimtx/claimtx/brokers/kafka" // registers the kind
	"github.com/claimtx/claimtx/brokers/kafka/kafkatest"
	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/internal/testenv"
	"github.com/claimtx/claimtx/store"
	"github.com/claimtx/claimtx/store/outbox"
)

// batches records a relay's OnBatch reports.
type batches struct {
	mu  sync.Mutex
	all []outbox.Batch
}

func (b *batches) add(x outbox.Batch) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.all = append(b.all, x)
}

func (b *batches) count(pred func(outbox.Batch) bool) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := 0
	for _, x := range b.all {
		if pred(x) {
			n++
		}
	}
	return n
}

func all(outbox.Batch) bool { return true }

// The relay publishes through a broker adapter chosen by configuration
// (gochannel, RabbitMQ, Kafka), every message carries the stable
// idempotency key and its metadata, and an idle relay is woken by NOTIFY:
// polling is set to an hour, so nothing else could wake it.
func TestRelayPublishesThroughBrokerOnNotify(t *testing.T) {
	t.Parallel()
	testenv.SkipBehindPooler(t, "it tests LISTEN, which a relay refuses behind a transaction pooler (TestRelayBehindTransactionPooler)")
	for _, kind := range []string{brokers.KindGoChannel, brokers.KindAMQP, brokers.KindKafka} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			testRelayThroughBroker(t, kind)
		})
	}
}

func testRelayThroughBroker(t *testing.T, kind string) {
	e := setup(t, 6)
	topic := testenv.UniqueName(t, 40)
	var bcfg brokers.Config
	switch kind {
	case brokers.KindGoChannel:
		bcfg = brokers.Config{Kind: brokers.KindGoChannel, GoChannel: brokers.GoChannelConfig{Name: t.Name()}}
	case brokers.KindAMQP:
		bcfg = amqpBrokers()
	case brokers.KindKafka:
		br, err := kafkatest.Start(t.Context(), kafkatest.Options{Addr: "127.0.0.1:0"})
		require.NoError(t, err)
		defer br.Close()
		bcfg = brokers.Config{Kind: brokers.KindKafka, Kafka: brokers.KafkaConfig{Brokers: br.Addrs(), ConsumerGroup: "relay-" + topic}}
	}
	var keys sync.Map
	pub, stopDownstream := e.runDownstream(t, bcfg, topic, func(msg *message.Message) {
		keys.Store(msg.Metadata.Get(store.IdempotencyKeyMetadata), msg.Metadata.Get("event_id"))
	})
	defer stopDownstream()

	rec := &batches{}
	relay, err := outbox.New(e.st, pub, outbox.Config{PollInterval: time.Hour, CleanupInterval: -1, OnBatch: rec.add})
	require.NoError(t, err)
	stop := runRelay(t, relay.Run)
	// The first batch runs at start, the second when LISTEN is in place.
	eventually(t, func() bool { return rec.count(all) >= 2 })

	e.enqueue(t, topic, "order", 20)
	eventually(t, func() bool { return e.rec.count(framework.Applied) == 20 })
	stop()

	require.Zero(t, e.stats(t).Pending)
	require.Equal(t, int64(20), e.stats(t).Sent)
	e.requireEachEffectOnce(t, 20)
	n := 0
	keys.Range(func(k, v any) bool {
		require.NotEmpty(t, k)
		require.True(t, strings.HasPrefix(v.(string), "order-"), "metadata is relayed")
		n++
		return true
	})
	require.Equal(t, 20, n)
}

// A failed Publish stops the batch: what was published before is marked,
// the failed call's rows record the failure, later rows stay pending
// untouched, and the next batch continues in order.
func TestRelayStopsAtFirstFailedPublish(t *testing.T) {
	t.Parallel()
	e := setup(t, 4)
	e.enqueue(t, "a", "a1", 2)
	e.enqueue(t, "b", "b1", 2)
	e.enqueue(t, "a", "a2", 1)
	pub := newApplyingPublisher(e.downstream)
	var failB atomic.Bool
	failB.Store(true)
	pub.fail = func(topic string) error {
		if topic == "b" && failB.Load() {
			return errors.New("broker refused topic b")
		}
		return nil
	}
	relay, err := outbox.New(e.st, pub, relayConfig(outbox.Config{}))
	require.NoError(t, err)

	b := relay.RelayBatchForTest(context.Background())
	require.ErrorContains(t, b.Err, "broker refused topic b")
	require.Equal(t, 5, b.Locked)
	require.Equal(t, 2, b.Published)
	s := e.stats(t)
	require.Equal(t, int64(2), s.Sent)
	require.Equal(t, int64(3), s.Pending)
	require.Equal(t, int64(2), s.Failing, "the failed call's rows, not the untouched one after them")
	require.Equal(t, int64(2), e.scalar(t, "SELECT count(*) FROM outbox WHERE last_error LIKE '%broker refused topic b%' AND attempts = 1"))

	failB.Store(false)
	b = relay.RelayBatchForTest(context.Background())
	require.NoError(t, b.Err)
	require.Equal(t, 3, b.Published)
	require.Equal(t, []string{"a1-0", "a1-1", "b1-0", "b1-1", "a2-0"}, pub.order, "one relay publishes in id order")
	require.Equal(t, int64(5), e.stats(t).Sent)
	e.requireEachEffectOnce(t, 5)
}

// A Publish that never returns (the broker took the connection but never
// confirms) fails the batch after PublishTimeout instead of holding it and
// its row locks forever. The abandoned call completing later is one more
// resend, dropped downstream by the idempotency key.
func TestRelayPublishTimeout(t *testing.T) {
	t.Parallel()
	e := setup(t, 4)
	e.enqueue(t, "t", "m", 3)
	pub := newApplyingPublisher(e.downstream)
	release := make(chan struct{})
	var hang atomic.Bool
	hang.Store(true)
	pub.fail = func(string) error {
		if hang.Load() {
			<-release
		}
		return nil
	}
	relay, err := outbox.New(e.st, pub, relayConfig(outbox.Config{PublishTimeout: 50 * time.Millisecond}))
	require.NoError(t, err)

	start := time.Now()
	b := relay.RelayBatchForTest(context.Background())
	require.ErrorIs(t, b.Err, outbox.ErrPublishTimeout)
	require.Less(t, time.Since(start), 10*time.Second)
	require.Equal(t, 3, b.Locked)
	require.Zero(t, b.Published)
	require.Equal(t, int64(3), e.stats(t).Pending)
	require.Equal(t, int64(3), e.scalar(t, "SELECT count(*) FROM outbox WHERE last_error LIKE '%publish timed out%' AND attempts = 1"))

	// The hung call completes after all: its messages arrive downstream.
	hang.Store(false)
	close(release)
	eventually(t, func() bool { return e.rec.count(framework.Applied) == 3 })
	// The rows were still pending, so the next batch sends them again.
	b = relay.RelayBatchForTest(context.Background())
	require.NoError(t, b.Err)
	require.Equal(t, 3, b.Published)
	require.Equal(t, int64(3), e.stats(t).Sent)
	e.requireEachEffectOnce(t, 3)
	require.Equal(t, 3, e.rec.count(framework.Duplicate), "the resends were dropped by the idempotency key")

	// A negative timeout disables the bound: a Publish that returns only
	// once the test releases it (well after it started) still completes
	// the batch; a bound, even a tiny one, would have failed it first.
	e.enqueue(t, "t", "slow", 1)
	entered, release2 := make(chan struct{}), make(chan struct{})
	pub.fail = func(string) error {
		close(entered)
		<-release2
		return nil
	}
	unbounded, err := outbox.New(e.st, pub, relayConfig(outbox.Config{PublishTimeout: -1}))
	require.NoError(t, err, "a negative timeout disables the bound")
	done := make(chan outbox.Batch, 1)
	go func() { done <- unbounded.RelayBatchForTest(context.Background()) }()
	<-entered
	select {
	case b := <-done:
		t.Fatalf("the batch ended while Publish was still running: %+v", b)
	default:
	}
	close(release2)
	b = <-done
	require.NoError(t, b.Err)
	require.Equal(t, 1, b.Published)
}

// The broker goes down while relaying: Publish fails, rows stay pending
// with the failure recorded, the relay backs off and resumes by itself
// when the broker is back. Nothing is lost, nothing applied twice.
func TestRelayResumesAfterBrokerOutage(t *testing.T) {
	t.Parallel()
	e := setup(t, 4)
	pub := newApplyingPublisher(e.downstream)
	var down atomic.Bool
	down.Store(true)
	pub.fail = func(string) error {
		if down.Load() {
			return errors.New("connection refused")
		}
		return nil
	}
	rec := &batches{}
	relay, err := outbox.New(e.st, pub, relayConfig(outbox.Config{
		BatchSize: 10, InitialBackoff: 5 * time.Millisecond, MaxBackoff: 20 * time.Millisecond, OnBatch: rec.add,
	}))
	require.NoError(t, err)
	e.enqueue(t, "t", "m", 35)
	runRelay(t, relay.Run)

	failed := func(b outbox.Batch) bool { return b.Err != nil }
	eventually(t, func() bool { return rec.count(failed) >= 5 }, "the relay keeps retrying")
	s := e.stats(t)
	require.Equal(t, int64(35), s.Pending, "rows stay while the broker is down")
	require.Zero(t, s.Sent)
	require.Positive(t, s.Failing)
	require.Zero(t, e.rec.count(framework.Applied))

	down.Store(false)
	eventually(t, func() bool { return e.stats(t).Pending == 0 })
	e.requireEachEffectOnce(t, 35)
	require.Equal(t, 35, e.rec.count(framework.Applied))
	require.Zero(t, e.rec.count(framework.Duplicate), "a failed Publish delivered nothing, so nothing is resent")
}

// The relay dies between Publish and the commit of its marks (here its
// database session is killed right after the broker accepted the batch):
// the rows were delivered but are still pending, the next relay publishes
// them again, and the downstream consumer drops every resend as a
// duplicate thanks to the stable idempotency key.
func TestRelayCrashAfterPublishResendIsDuplicate(t *testing.T) {
	t.Parallel()
	e := setup(t, 6)
	e.enqueue(t, "t", "m", 30)
	pub := newApplyingPublisher(e.downstream)
	var crashed atomic.Bool
	pub.after = func(string) {
		if crashed.CompareAndSwap(false, true) {
			killRelaySession(t, e)
		}
	}
	relay, err := outbox.New(e.st, pub, relayConfig(outbox.Config{BatchSize: 10}))
	require.NoError(t, err)

	b := relay.RelayBatchForTest(context.Background())
	require.Error(t, b.Err, "marking must fail: the session is gone")
	require.Equal(t, 10, b.Published)
	require.Equal(t, int64(30), e.stats(t).Pending, "no mark survived the crash")
	require.Equal(t, 10, e.rec.count(framework.Applied), "the downstream consumer got the batch")

	// A relay started afterwards (the restarted process) drains the outbox.
	for e.stats(t).Pending > 0 {
		require.NoError(t, relay.RelayBatchForTest(context.Background()).Err)
	}
	published, overlaps := pub.snapshot()
	require.Zero(t, overlaps)
	require.Len(t, published, 30)
	resent := 0
	for _, n := range published {
		require.LessOrEqual(t, n, 2)
		if n == 2 {
			resent++
		}
	}
	require.Equal(t, 10, resent, "the crashed batch was published again")
	require.Equal(t, 30, e.rec.count(framework.Applied))
	require.Equal(t, 10, e.rec.count(framework.Duplicate), "every resend dropped downstream")
	e.requireEachEffectOnce(t, 30)
}

// killRelaySession terminates the backend holding the relay's row locks
// on this test's outbox, as a crashed relay process would lose it.
func killRelaySession(t *testing.T, e env) {
	t.Helper()
	n := e.scalar(t, `SELECT count(pg_terminate_backend(pid)) FROM (
		SELECT DISTINCT l.pid FROM pg_locks l
		WHERE l.relation = to_regclass($1) AND l.mode = 'RowShareLock' AND l.pid <> pg_backend_pid()) p`,
		e.schema+".outbox")
	require.Equal(t, int64(1), n, "exactly one relay session holds the batch")
}

// A graceful stop (context cancelled while publishing) starts no further
// Publish but still marks what the broker accepted: no resends.
func TestRelayGracefulStopMarksWhatWasPublished(t *testing.T) {
	t.Parallel()
	e := setup(t, 4)
	e.enqueue(t, "a", "a", 3)
	e.enqueue(t, "b", "b", 3)
	pub := newApplyingPublisher(e.downstream)
	ctx, cancel := context.WithCancel(context.Background())
	pub.after = func(topic string) {
		if topic == "a" {
			cancel()
		}
	}
	relay, err := outbox.New(e.st, pub, relayConfig(outbox.Config{}))
	require.NoError(t, err)
	require.NoError(t, relay.Run(ctx))

	s := e.stats(t)
	require.Equal(t, int64(3), s.Sent, "topic a was published and marked")
	require.Equal(t, int64(3), s.Pending, "topic b was not started")
	require.Zero(t, s.Failing, "a shutdown is not a publish failure")

	require.NoError(t, relay.RelayBatchForTest(context.Background()).Err)
	published, _ := pub.snapshot()
	for k, n := range published {
		require.Equal(t, 1, n, "key %s", k)
	}
	require.Zero(t, e.rec.count(framework.Duplicate))
	e.requireEachEffectOnce(t, 6)
}

// Three relays drain 10,000 rows at once: every row is published exactly
// once (no two relays ever hold the same row), and the downstream consumer
// applies each once.
func TestThreeRelaysTenThousandRows(t *testing.T) {
	t.Parallel()
	const rows, relays = 10_000, 3
	e := setup(t, 12)
	e.enqueue(t, "t", "m", rows)
	pub := newApplyingPublisher(e.downstream)

	start := time.Now()
	for i := 0; i < relays; i++ {
		relay, err := outbox.New(e.st, pub, relayConfig(outbox.Config{PollInterval: 50 * time.Millisecond}))
		require.NoError(t, err)
		runRelay(t, relay.Run)
	}
	require.Eventually(t, func() bool { return e.stats(t).Pending == 0 }, 60*time.Second, 20*time.Millisecond)
	elapsed := time.Since(start)
	t.Logf("%d rows relayed by %d relays, each applied downstream in its own claim transaction, in %s (%.0f rows/s)",
		rows, relays, elapsed.Round(time.Millisecond), float64(rows)/elapsed.Seconds())

	published, overlaps := pub.snapshot()
	require.Zero(t, overlaps, "a row was in flight in two relays at once")
	require.Len(t, published, rows)
	for k, n := range published {
		require.Equal(t, 1, n, "row %s published %d times", k, n)
	}
	require.Equal(t, rows, e.rec.count(framework.Applied))
	e.requireEachEffectOnce(t, rows)
}

// Sent rows are kept for Retention, then deleted in batches; pending rows
// never are.
func TestRelayCleanupDeletesOldSentRows(t *testing.T) {
	t.Parallel()
	e := setup(t, 4)
	e.enqueue(t, "t", "m", 25)
	pub := newApplyingPublisher(e.downstream)
	relay, err := outbox.New(e.st, pub, relayConfig(outbox.Config{BatchSize: 20, Retention: time.Millisecond}))
	require.NoError(t, err)
	relay.SetCleanupBatchForTest(7)
	require.NoError(t, relay.RelayBatchForTest(context.Background()).Err)
	require.Equal(t, int64(20), e.stats(t).Sent)

	var deleted int64
	eventually(t, func() bool {
		n, err := relay.Cleanup(context.Background())
		require.NoError(t, err)
		deleted += n
		return deleted == 20
	})
	s := e.stats(t)
	require.Zero(t, s.Sent)
	require.Equal(t, int64(5), s.Pending)

	kept, err := outbox.New(e.st, pub, relayConfig(outbox.Config{})) // 24h retention
	require.NoError(t, err)
	require.NoError(t, kept.RelayBatchForTest(context.Background()).Err)
	n, err := kept.Cleanup(context.Background())
	require.NoError(t, err)
	require.Zero(t, n)
	require.Equal(t, int64(5), e.stats(t).Sent)
}

func TestRelayConfiguration(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	pub := newApplyingPublisher(e.downstream)
	for _, tc := range []struct {
		field string
		st    *store.Store
		pub   message.Publisher
		cfg   outbox.Config
	}{
		{"Store", nil, pub, outbox.Config{}},
		{"Publisher", e.st, nil, outbox.Config{}},
		{"BatchSize", e.st, pub, outbox.Config{BatchSize: -1}},
		{"PollInterval", e.st, pub, outbox.Config{PollInterval: -time.Second}},
		{"InitialBackoff", e.st, pub, outbox.Config{InitialBackoff: -1}},
		{"MaxBackoff", e.st, pub, outbox.Config{MaxBackoff: -1}},
		{"Retention", e.st, pub, outbox.Config{Retention: -time.Hour}},
	} {
		_, err := outbox.New(tc.st, tc.pub, tc.cfg)
		var ce *framework.ConfigError
		require.ErrorAs(t, err, &ce, tc.field)
		require.Equal(t, tc.field, ce.Field)
		require.Contains(t, err.Error(), fmt.Sprintf("%q", tc.field))
	}
}

// Environment of the relay subprocess.
const (
	relayProcessEnv = "CLAIMTX_TEST_RELAY_PROCESS"
	relaySchemaEnv  = "CLAIMTX_TEST_RELAY_SCHEMA"
)

// amqpBrokers is the RabbitMQ configuration of the kill test. Its queues
// expire a minute after last use, so reruns leave nothing behind.
func amqpBrokers() brokers.Config {
	url := os.Getenv("TEST_AMQP_URL")
	return brokers.Config{Kind: brokers.KindAMQP, AMQP: brokers.AMQPConfig{
		URL:            url,
		Concurrency:    1,
		NackDelay:      -1,
		DialTimeout:    10 * time.Second,
		QueueArguments: map[string]any{"x-expires": int32(60_000)},
		ConnectionName: "claimtx-outbox-test",
	}}
}

// killingPublisher is the relay process's publisher: once RabbitMQ
// confirmed a Publish, the process SIGKILLs itself, before the relay can
// mark the rows. That is the window a crash must hit to cause resends.
type killingPublisher struct{ message.Publisher }

func (p killingPublisher) Publish(topic string, msgs ...*message.Message) error {
	if err := p.Publisher.Publish(topic, msgs...); err != nil {
		return err
	}
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {} // never return to the relay
}

// TestRelayProcess is not a test: it is the relay process that
// TestRelayKilledBetweenPublishAndMark starts and kills.
func TestRelayProcess(t *testing.T) {
	if os.Getenv(relayProcessEnv) == "" {
		t.Skip("run by TestRelayKilledBetweenPublishAndMark")
	}
	pool := testenv.Pool(t, os.Getenv(relaySchemaEnv), 4)
	st, err := store.New(pool, store.Config{Schema: os.Getenv(relaySchemaEnv)})
	require.NoError(t, err)
	pub, err := brokers.NewPublisher(amqpBrokers(), nil)
	require.NoError(t, err)
	relay, err := outbox.New(st, killingPublisher{pub}, relayConfig(outbox.Config{}))
	require.NoError(t, err)
	require.NoError(t, relay.Run(context.Background()))
	t.Fatal("the relay returned instead of being killed")
}

// A relay process is SIGKILLed after RabbitMQ confirmed its batch and
// before it marked the rows. A relay started afterwards publishes the same
// rows again; the downstream claimtx consumer, keyed by
// metadata:claimtx_idempotency_key, applies each message once and records
// every resend as a duplicate.
func TestRelayKilledBetweenPublishAndMark(t *testing.T) {
	t.Parallel()
	if os.Getenv(relayProcessEnv) != "" {
		t.Skip("inside the relay process")
	}
	const n = 20
	e := setup(t, 6)
	topic := testenv.UniqueName(t, 40)
	e.enqueue(t, topic, "m", n)

	cmd := exec.Command(os.Args[0], "-test.run=^TestRelayProcess$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), relayProcessEnv+"=1", relaySchemaEnv+"="+e.schema)
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	require.True(t, errors.As(err, &exit), "relay process: %v\n%s", err, out)
	ws, ok := exit.Sys().(syscall.WaitStatus)
	require.True(t, ok)
	require.True(t, ws.Signaled() && ws.Signal() == syscall.SIGKILL, "relay process was not killed: %v\n%s", err, out)
	require.Equal(t, int64(n), e.stats(t).Pending, "the killed relay marked nothing")

	// Downstream consumer on the RabbitMQ queue, and a healthy relay.
	pub, stopDownstream := e.runDownstream(t, amqpBrokers(), topic, nil)
	defer stopDownstream()
	relay, err := outbox.New(e.st, pub, relayConfig(outbox.Config{}))
	require.NoError(t, err)
	stop := runRelay(t, relay.Run)

	eventually(t, func() bool { return e.rec.count(framework.Applied)+e.rec.count(framework.Duplicate) == 2*n })
	stop()
	require.Equal(t, n, e.rec.count(framework.Applied))
	require.Equal(t, n, e.rec.count(framework.Duplicate), "every resend of the killed relay's batch is a duplicate")
	require.Zero(t, e.stats(t).Pending)
	e.requireEachEffectOnce(t, n)
}
