package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/claimtx/claimtx/examples/loyalty/feed"
)

const (
	// sigtermBound is what a SIGTERM may take: DrainTimeout plus a few
	// seconds. DESIGN.md (Shutdown) asks for "the drain timeout plus a
	// documented few seconds, whatever the broker client is doing";
	// framework/consumer documents the drain (Config.DrainTimeout, 15 s),
	// and behind it routerCloseTimeout (5 s) for the subscriptions to end.
	// (Its abortGrace, 5 s more, is only for handlers that ignore their
	// context's cancellation; the loyalty handlers honour it, and these
	// rounds hold no handler anyway.)
	sigtermBound = drainTimeout + 5*time.Second
	// boundRounds SIGTERMs per phase; a phase stops early once
	// boundMaxHung of them hung (enough to tell, and each costs
	// sigtermBound).
	boundRounds  = 10
	boundMaxHung = 3
	boundBudget  = 4*time.Minute + 30*time.Second
	// boundCatchUp: how long the final clean run may take to consume the
	// rest (Kafka: a rebalance may wait out session + rebalance timeout).
	boundCatchUp = kafkaSessionTimeout + kafkaRebalanceTimeout + 15*time.Second
)

// TestSIGTERMBounded: a SIGTERM ends the consumer within DrainTimeout + 5 s
// (sigtermBound) wherever it lands, and what was not committed is never
// acked. Kafka runs on a plain kfake cluster (one broker, 4 partitions,
// group min session timeout 500 ms) with the example's default timeouts;
// RabbitMQ on the shared server; each in per-message and batch mode.
//
// Work is certainly in flight when the signal comes: before each round the
// test locks balances (EXCLUSIVE: reads go on, the handlers' writes wait),
// so the claim transactions the consumers start wait on it. At the SIGTERM,
// if the signalled process has such a transaction, the lock is let go at
// once (its drain must let it commit); if it has none (it is still
// starting or joining), the lock is kept until that process exited (at
// most sigtermBound), so whatever it waits for (a rebalance held by the
// other member's in-flight message, say) does not end for it.
//
//   - startup: 10 rounds of publish 100 orders (with copies), start a
//     consumer, SIGTERM it at a random point of its start-up (0-3 s:
//     connecting, creating tables, subscribing, joining the group, first
//     messages);
//   - rebalance: a first consumer has a message in flight; 10 rounds of
//     start a second one, SIGTERM one of the two at random 0-4 s later
//     (the joining one, whose join waits for the rebalance, or the one the
//     join made rebalance);
//   - then a clean run consumes the rest: every order credited exactly once
//     (a message acked without its effect committed would be missing).
//
// kafka-unreachable: SIGTERM while the Kafka broker cannot be reached: a
// closed port from the start (5 rounds at a random point of start-up), and
// a cluster (kfake with a data directory, same port) closed under a
// consuming instance (3 rounds, SIGTERM 0-2 s after the close), started
// again for the next round and for the clean run, which checks exactness.
//
// Every exit time is logged; a process still running at sigtermBound is
// SIGKILLed and counted as a hung shutdown (a failure). The schedule is
// random (the seed is logged); the assertions wait for conditions.
func TestSIGTERMBounded(t *testing.T) {
	t.Parallel()
	modes := []struct {
		name string
		env  []string
	}{{"per-message", nil}, {"batch", []string{"BATCH_SIZE=64"}}}
	for _, kind := range []string{"kafka", "amqp"} {
		for _, mode := range modes {
			t.Run(kind+"/"+mode.name, func(t *testing.T) {
				t.Parallel()
				h := newHarnessWith(t, kind, harnessOptions{plainKafka: true, partitions: 4, defaultKafkaTimeouts: true})
				h.extraEnv = append(h.extraEnv, mode.env...)
				b := newBoundRun(t, h)
				b.startupRounds()
				b.rebalanceRounds()
				b.cleanRun()
				b.finish()
			})
		}
	}
	for _, mode := range modes {
		t.Run("kafka-unreachable/"+mode.name, func(t *testing.T) {
			t.Parallel()
			h := newHarnessWith(t, "kafka", harnessOptions{plainKafka: true, partitions: 4, defaultKafkaTimeouts: true})
			h.extraEnv = append(h.extraEnv, mode.env...)
			rc := newRestartableKafka(t, h)
			b := newBoundRun(t, h)
			b.closedPortRounds()
			b.clusterClosedRounds(rc)
			b.cleanRun()
			b.finish()
		})
	}
}

// boundRun is the state of one TestSIGTERMBounded subtest.
type boundRun struct {
	t        *testing.T
	h        *harness
	seed     uint64
	rng      *rand.Rand
	deadline time.Time
	all      []order // every order published
	records  []shutdownRecord
	procs    []*proc
	apps     map[*proc]string // application_name of each process
}

func newBoundRun(t *testing.T, h *harness) *boundRun {
	seed := testSeed(t)
	t.Logf("seed %d", seed)
	return &boundRun{t: t, h: h, seed: seed, rng: rand.New(rand.NewPCG(seed, seed^0xb0d)),
		deadline: time.Now().Add(boundBudget), apps: map[*proc]string{}}
}

// publish sends n new orders, about one in ten followed by a copy of an
// earlier one (a producer's retry).
func (b *boundRun) publish(n int) {
	b.t.Helper()
	fresh := orders(len(b.all)+1, n)
	b.all = append(b.all, fresh...)
	ids, payloads := encode(b.t, fresh)
	allIDs, allPayloads := encode(b.t, b.all)
	for range fresh {
		if b.rng.IntN(10) == 0 {
			j := b.rng.IntN(len(b.all))
			ids, payloads = append(ids, allIDs[j]), append(payloads, allPayloads[j])
		}
	}
	b.h.publishRaw(ids, payloads)
}

// start runs a consumer with an application_name of its own, so its
// backends can be found in pg_stat_activity.
func (b *boundRun) start(extra ...string) *proc {
	b.t.Helper()
	app := fmt.Sprintf("loyalty-bound-%d", len(b.procs))
	p := b.h.start(append([]string{"DATABASE_URL=" + b.h.dbURLNamed(b.t, app)}, extra...)...)
	b.procs = append(b.procs, p)
	b.apps[p] = app
	return p
}

// balancesLock is the test's EXCLUSIVE lock on balances, held in a
// transaction of its own until release.
type balancesLock struct {
	t    *testing.T
	tx   pgx.Tx
	pid  int
	done bool
}

func (b *boundRun) lockBalances() *balancesLock {
	b.t.Helper()
	ctx := context.Background()
	// The tables must exist to be locked; the consumer's own start-up
	// code creates them (and does nothing when they are there).
	require.NoError(b.t, createTables(ctx, b.h.pool))
	tx, err := b.h.pool.Begin(ctx)
	require.NoError(b.t, err)
	l := &balancesLock{t: b.t, tx: tx}
	b.t.Cleanup(l.release)
	_, err = tx.Exec(ctx, "LOCK TABLE balances IN EXCLUSIVE MODE")
	require.NoError(b.t, err)
	require.NoError(b.t, tx.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&l.pid))
	return l
}

func (l *balancesLock) release() {
	if !l.done {
		l.done = true
		require.NoError(l.t, l.tx.Rollback(context.Background()))
	}
}

// inFlight is how many claim transactions of p wait on the lock.
func (b *boundRun) inFlight(p *proc, l *balancesLock) int {
	return max(b.h.tryCount(`SELECT count(*) FROM pg_stat_activity
WHERE application_name = $1 AND wait_event_type = 'Lock' AND $2 = ANY (pg_blocking_pids(pid))`, b.apps[p], l.pid), 0)
}

// sigtermHolding SIGTERMs p with the lock held: let go at once if p has a
// claim transaction waiting on it (the drain must let it commit), else
// once p exited.
func (b *boundRun) sigtermHolding(p *proc, l *balancesLock, what string) {
	b.t.Helper()
	if n := b.inFlight(p, l); n > 0 {
		b.sigterm(p, fmt.Sprintf("%s, %d claim transactions in flight", what, n), l.release)
		return
	}
	b.sigterm(p, what+", nothing in flight", nil)
	l.release()
}

// jitter is a random duration in [0, d): where the SIGTERM lands. A
// schedule, not a synchronisation: what is asserted does not depend on it.
func (b *boundRun) jitter(d time.Duration) time.Duration {
	return time.Duration(b.rng.Int64N(int64(d)))
}

func (b *boundRun) hung() int {
	n := 0
	for _, r := range b.records {
		if r.hung {
			n++
		}
	}
	return n
}

// sigterm SIGTERMs p, records and logs how long it took, and fails the
// test (going on) if it hung.
func (b *boundRun) sigterm(p *proc, what string, afterSignal func()) {
	b.t.Helper()
	r := p.sigterm(what, sigtermBound, afterSignal)
	b.records = append(b.records, r)
	if r.took >= 5*time.Second {
		b.t.Logf("%s; the process's last lines:\n%s", r, outputTail(p.out.String(), 8))
	} else {
		b.t.Log(r)
	}
	if r.hung {
		b.t.Errorf("%s: the consumer did not exit within %s of SIGTERM (DrainTimeout %s + 5s)", what, sigtermBound, drainTimeout)
	}
}

// more reports whether a phase goes on: not once it has seen boundMaxHung
// hung shutdowns, nor past the budget.
func (b *boundRun) more(phase string, hungBefore int) bool {
	if b.hung()-hungBefore >= boundMaxHung {
		b.t.Logf("%s: %d hung shutdowns, skipping its remaining rounds", phase, boundMaxHung)
		return false
	}
	if time.Until(b.deadline) < 2*sigtermBound {
		b.t.Errorf("%s: the subtest's budget (%s) is spent, skipping its remaining rounds\n%s", phase, boundBudget, b.summary())
		return false
	}
	return true
}

func (b *boundRun) startupRounds() {
	b.t.Helper()
	hungBefore := b.hung()
	for round := 1; round <= boundRounds && b.more("startup", hungBefore); round++ {
		l := b.lockBalances()
		b.publish(100)
		p := b.start()
		at := b.jitter(3 * time.Second)
		time.Sleep(at)
		b.sigtermHolding(p, l, fmt.Sprintf("startup %d: SIGTERM %s after start", round, at.Round(time.Millisecond)))
	}
}

func (b *boundRun) rebalanceRounds() {
	b.t.Helper()
	hungBefore := b.hung()
	first := b.start()
	for round := 1; round <= boundRounds && b.more("rebalance", hungBefore); round++ {
		// The group is mid-work: the first consumer has a message in
		// flight, waiting on the lock.
		l := b.lockBalances()
		b.publish(100)
		if !waitUntil(boundCatchUp, func() bool { return b.inFlight(first, l) > 0 || !first.running() }) || !first.running() {
			b.t.Fatalf("rebalance %d: the first consumer took no message within %s\n%s", round, boundCatchUp, b.summary())
		}
		second := b.start()
		at := b.jitter(4 * time.Second)
		time.Sleep(at)
		if b.rng.IntN(2) == 0 {
			b.sigtermHolding(second, l, fmt.Sprintf("rebalance %d: SIGTERM the joining consumer %s after its start", round, at.Round(time.Millisecond)))
		} else {
			b.sigtermHolding(first, l, fmt.Sprintf("rebalance %d: SIGTERM the consuming one %s after the second started", round, at.Round(time.Millisecond)))
			first = second
		}
	}
	b.sigterm(first, "rebalance: SIGTERM the last one", nil)
}

// closedPortRounds: KAFKA_BROKERS names a port nobody listens on.
func (b *boundRun) closedPortRounds() {
	b.t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(b.t, err)
	closed := ln.Addr().String()
	require.NoError(b.t, ln.Close())
	hungBefore := b.hung()
	for round := 1; round <= 5 && b.more("closed port", hungBefore); round++ {
		p := b.start("KAFKA_BROKERS=" + closed)
		at := b.jitter(3 * time.Second)
		time.Sleep(at)
		b.sigterm(p, fmt.Sprintf("closed port %d: SIGTERM %s after start", round, at.Round(time.Millisecond)), nil)
	}
}

// clusterClosedRounds: the cluster goes away under a consuming instance.
func (b *boundRun) clusterClosedRounds(rc *restartableKafka) {
	b.t.Helper()
	hungBefore := b.hung()
	for round := 1; round <= 3 && b.more("cluster closed", hungBefore); round++ {
		b.publish(100)
		p := b.start()
		if !waitUntil(boundCatchUp, func() bool { return p.settled() > 0 || !p.running() }) {
			b.t.Fatalf("cluster closed %d: the consumer settled nothing within %s\n%s", round, boundCatchUp, b.summary())
		}
		rc.stop()
		at := b.jitter(2 * time.Second)
		time.Sleep(at)
		b.sigterm(p, fmt.Sprintf("cluster closed %d: SIGTERM %s after the cluster closed", round, at.Round(time.Millisecond)), nil)
		rc.start()
	}
}

// cleanRun publishes a last 200 orders and consumes what is left, then
// stops (by SIGTERM, bounded too).
func (b *boundRun) cleanRun() {
	b.t.Helper()
	b.publish(200)
	p := b.start()
	want := len(b.all)
	if !waitUntil(boundCatchUp, func() bool {
		return b.h.tryCount("SELECT count(DISTINCT order_id) FROM point_ledger") >= want
	}) {
		b.t.Errorf("clean run: %d of %d orders applied after %s\n%s",
			max(b.h.tryCount("SELECT count(DISTINCT order_id) FROM point_ledger"), 0), want, boundCatchUp, b.summary())
	}
	b.sigterm(p, "clean run: SIGTERM", nil)
}

// finish checks exactness and logs the summary.
func (b *boundRun) finish() {
	b.t.Helper()
	b.t.Log(b.summary())
	b.h.assertExact(b.all)
}

func (b *boundRun) summary() string {
	var sb strings.Builder
	var slowest time.Duration
	for _, r := range b.records {
		slowest = max(slowest, r.took)
	}
	fmt.Fprintf(&sb, "seed %d: %d SIGTERMs, %d hung past %s, slowest %s; %d of %d orders applied",
		b.seed, len(b.records), b.hung(), sigtermBound, slowest.Round(10*time.Millisecond),
		max(b.h.tryCount("SELECT count(DISTINCT order_id) FROM point_ledger"), 0), len(b.all))
	for _, r := range b.records {
		fmt.Fprintf(&sb, "\n  %s", r)
	}
	sb.WriteString("\nlogs:" + logExcerpts(b.procs))
	return sb.String()
}

// restartableKafka is a kfake cluster that keeps its state in a directory
// and listens on the same port each time it starts, so a test can close
// it under a consumer and bring it back. It replaces the harness's
// cluster: the harness's client and KAFKA_BROKERS point at it.
type restartableKafka struct {
	t    *testing.T
	dir  string
	port int
	c    *kfake.Cluster
}

func newRestartableKafka(t *testing.T, h *harness) *restartableKafka {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := ln.Addr().(*net.TCPAddr).Port
	require.NoError(t, ln.Close())
	rc := &restartableKafka{t: t, dir: t.TempDir(), port: port}
	rc.start()
	t.Cleanup(rc.stop)
	h.kafkaAddr = fmt.Sprintf("127.0.0.1:%d", port)
	cl, err := kgo.NewClient(kgo.SeedBrokers(h.kafkaAddr), kgo.ProducerLinger(0))
	require.NoError(t, err)
	t.Cleanup(cl.Close)
	h.kcl = cl
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	adm := kadm.NewClient(cl)
	require.NoError(t, feed.CreateKafkaTopics(ctx, adm, h.topic, 4))
	return rc
}

func (rc *restartableKafka) start() {
	rc.t.Helper()
	var err error
	// The port was just released (by the last Close): retry a bound
	// while the listener can not be had yet.
	require.Eventually(rc.t, func() bool {
		rc.c, err = kfake.NewCluster(kfake.Ports(rc.port), kfake.GroupMinSessionTimeout(500*time.Millisecond), kfake.DataDir(rc.dir))
		return err == nil
	}, 10*time.Second, 50*time.Millisecond, "start kfake on port %d: %v", rc.port, err)
}

func (rc *restartableKafka) stop() {
	if rc.c != nil {
		rc.c.Close()
		rc.c = nil
	}
}
