package main

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
)

// The example's Kafka defaults (brokers/kafka: defaultSessionTimeout,
// defaultRebalanceTimeout) and the consumer's (framework/consumer:
// defaultDrainTimeout). The tests of this file and of
// shutdown_bound_test.go run the consumer with them, as a user does:
// harnessOptions.defaultKafkaTimeouts.
const (
	kafkaSessionTimeout   = 10 * time.Second
	kafkaRebalanceTimeout = 60 * time.Second
	drainTimeout          = 15 * time.Second
)

const (
	mixedOrders = 3000 // valid orders, each published once at least
	mixedRounds = 6    // SIGKILL-then-SIGTERM rounds
	mixedBad    = 6    // undecodable or invalid payloads among them
	// mixedProgressBound: after a rebalance the group must be consuming
	// again within session timeout + rebalance timeout; the margin covers
	// a heartbeat interval (session/3) and the process start.
	mixedProgressBound = kafkaSessionTimeout + kafkaRebalanceTimeout + 15*time.Second
	// mixedExitBound: SIGTERM to exit, DrainTimeout plus abortGrace and
	// routerCloseTimeout (framework/consumer/drain.go: 5 s each), which is
	// what keeps a shutdown inside Kubernetes' 30 s grace period.
	mixedExitBound = drainTimeout + 10*time.Second
	// mixedBudget bounds a whole subtest: it fails with what it saw
	// rather than running into go test's timeout.
	mixedBudget = 4*time.Minute + 30*time.Second
)

// TestKafkaMixedRestarts is a rolling deploy that meets crashes, on Kafka
// with the timeouts a user runs (10 s session, 60 s rebalance, 15 s drain):
// two consumer processes share the group of a 4-partition topic. Six
// rounds, each: publish a chunk; once the group is certainly mid-work (a
// claim transaction held in flight, see killMidWork) SIGKILL a random
// instance and restart it at once; 1-2 s later SIGTERM a random one of the
// two (often one still joining the group) and restart it as soon as it
// exited. The rounds do not wait for the group to settle. Orders (3,000,
// with ~10% duplicates and 6 bad payloads) are published by a plain
// franz-go producer in seven chunks, one before the first round and one
// at the start of each round.
//
// It requires what a user can rely on:
//   - after each round the group takes work again, and after the last one
//     it has applied every order and is stable with both live members
//     sharing the partitions, within session + rebalance timeout (+ a
//     margin) of the last restart (mixedProgressBound);
//   - every SIGTERM ends its process within DrainTimeout + 10 s
//     (mixedExitBound); one that does not is SIGKILLed and counted as a
//     hung shutdown (a failure);
//   - in the end every order is credited exactly once and the bad input is
//     in the poison topic.
//
// It runs on a plain kfake cluster (one broker, group min session timeout
// 500 ms, no evictor: what the bug report ran) and on the project's dev
// broker (with its evictor). The schedule is random (the seed is logged);
// the assertions wait for conditions (LOYALTY_TEST_SEED replays a
// schedule, as far as timing allows). Each subtest is bounded
// (mixedBudget) and fails with a summary: orders unapplied, each SIGTERM's
// exit time, and the telling log lines of every process.
func TestKafkaMixedRestarts(t *testing.T) {
	t.Parallel()
	clusters := []struct {
		name  string
		plain bool
	}{{"kfake", true}, {"kafkatest", false}}
	modes := []struct {
		name string
		env  []string
	}{{"per-message", nil}, {"batch", []string{"BATCH_SIZE=64"}}}
	for _, c := range clusters {
		for _, m := range modes {
			t.Run(c.name+"/"+m.name, func(t *testing.T) {
				t.Parallel()
				if c.plain && os.Getenv("LOYALTY_TEST_PLAIN_KFAKE") == "" {
					// Plain kfake never expires a member that died
					// while its SyncGroup (or JoinGroup) answer was
					// being written, and restarts its rebalance timer at
					// every join: now and then a SIGKILL leaves the group
					// PreparingRebalance for good, with no client able to
					// help it (docs/design.md, "Kafka consumer group").
					// It passed 6 of 6 runs alone and failed 2 of 2 under
					// the full -race suite, so the CI gate runs the dev
					// broker, which behaves as a real broker does here.
					t.Skip("plain kfake: set LOYALTY_TEST_PLAIN_KFAKE=1 (kfake's dead-member gap makes it flaky; the dev broker subtests run always)")
				}
				h := newHarnessWith(t, "kafka", harnessOptions{plainKafka: c.plain, partitions: 4, defaultKafkaTimeouts: true})
				h.extraEnv = append(h.extraEnv, m.env...)
				runMixedRestarts(t, h)
			})
		}
	}
}

// feedChunk is one publication of the mixed feed: records (valid orders,
// copies of earlier ones, bad input) and the number of distinct valid
// orders published up to and including it.
type feedChunk struct {
	ids      []string
	payloads [][]byte
	upTo     int
}

// mixedFeed splits orders 1..nValid into chunks; each carries about 10%
// copies of orders of its own or an earlier chunk (a producer's retries)
// and, while they last, one of nBad bad payloads.
func mixedFeed(t *testing.T, rng *rand.Rand, nValid, nBad, chunks int) (valid []order, out []feedChunk) {
	t.Helper()
	valid = orders(1, nValid)
	ids, payloads := encode(t, valid)
	per := (nValid + chunks - 1) / chunks
	for c := 0; c < chunks; c++ {
		lo, hi := c*per, min((c+1)*per, nValid)
		var ch feedChunk
		for i := lo; i < hi; i++ {
			ch.ids, ch.payloads = append(ch.ids, ids[i]), append(ch.payloads, payloads[i])
			if rng.IntN(10) == 0 {
				j := rng.IntN(i + 1)
				ch.ids, ch.payloads = append(ch.ids, ids[j]), append(ch.payloads, payloads[j])
			}
			if c < nBad && i == lo+(hi-lo)/2 {
				id := int64(2_000_000 + c)
				var bad string
				switch c % 3 {
				case 0:
					bad = fmt.Sprintf(`{"order_id": %d, "customer_id": 1, "total_`, id)
				case 1:
					bad = fmt.Sprintf(`{"order_id": %d, "customer_id": 1}`, id)
				default:
					bad = fmt.Sprintf(`{"order_id": %d, "customer_id": 1, "total_cents": -5}`, id)
				}
				ch.ids, ch.payloads = append(ch.ids, fmt.Sprintf("bad-%d", c)), append(ch.payloads, []byte(bad))
			}
		}
		ch.upTo = hi
		out = append(out, ch)
	}
	return valid, out
}

// instance is one of the two consumer slots; each restart is a new
// process with an application_name of its own, so its backends can be
// found in pg_stat_activity.
type instance struct {
	slot, gen int
	app       string
	p         *proc
}

func (in *instance) String() string { return fmt.Sprintf("instance %d (gen %d)", in.slot, in.gen) }

// shutdownRecord is one SIGTERM and how the process took it.
type shutdownRecord struct {
	what   string
	took   time.Duration
	hung   bool
	status string
	idle   bool // the process had settled no message yet (most often: still joining)
}

func (r shutdownRecord) String() string {
	s := fmt.Sprintf("%s: %s", r.what, r.took.Round(10*time.Millisecond))
	if r.hung {
		s += " HUNG (SIGKILLed)"
	}
	if r.idle {
		s += " (had settled no message yet)"
	}
	if r.status != "" {
		s += " " + r.status
	}
	return s
}

// sigterm sends SIGTERM and waits up to bound for the process to exit; one
// still running then is SIGKILLed and reported hung. took is the time from
// the signal to the exit (for a hung one: to the SIGKILL's exit).
// afterSignal, if not nil, runs right after the signal is sent.
func (p *proc) sigterm(what string, bound time.Duration, afterSignal func()) shutdownRecord {
	r := shutdownRecord{what: what, idle: p.settled() <= 0}
	sent := time.Now()
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	if afterSignal != nil {
		afterSignal()
	}
	if !p.exited(bound) {
		r.hung = true
		p.kill()
	}
	r.took = time.Since(sent)
	if p.err != nil && !r.hung {
		r.status = "(" + p.err.Error() + ")"
	}
	return r
}

// settled is how many messages the process has settled (every outcome of
// claimtx_messages_total), read from its /metrics without failing the
// test: -1 when it cannot be read (not serving yet, or gone).
func (p *proc) settled() int {
	m := metricsAddrRE.FindStringSubmatch(p.out.String())
	if m == nil {
		return -1
	}
	cl := http.Client{Timeout: time.Second}
	resp, err := cl.Get("http://" + m[1] + "/metrics")
	if err != nil {
		return -1
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return -1
	}
	n := 0
	for _, line := range strings.Split(string(body), "\n") {
		if !strings.HasPrefix(line, "claimtx_messages_total{") {
			continue
		}
		if f := strings.Fields(line); len(f) > 0 {
			v, err := strconv.ParseFloat(f[len(f)-1], 64)
			if err == nil {
				n += int(v)
			}
		}
	}
	return n
}

// mixedRun is the state of one TestKafkaMixedRestarts subtest.
type mixedRun struct {
	t         *testing.T
	h         *harness
	seed      uint64
	deadline  time.Time
	insts     [2]*instance
	all       []*proc // every process started, for the log excerpts
	shutdowns []shutdownRecord
	progress  []string
}

func (m *mixedRun) start(slot int) {
	m.t.Helper()
	gen := 0
	if m.insts[slot] != nil {
		gen = m.insts[slot].gen + 1
	}
	in := &instance{slot: slot, gen: gen, app: fmt.Sprintf("loyalty-mixed-%d-%d", slot, gen)}
	in.p = m.h.start("DATABASE_URL=" + m.h.dbURLNamed(m.t, in.app))
	m.insts[slot] = in
	m.all = append(m.all, in.p)
}

func (m *mixedRun) applied() int {
	return max(m.h.tryCount("SELECT count(DISTINCT order_id) FROM point_ledger"), 0)
}

// budget is d, or what is left of the subtest's budget if that is less.
func (m *mixedRun) budget(d time.Duration) time.Duration {
	return max(min(d, time.Until(m.deadline)), 0)
}

// logExcerpts is logExcerpts over every process of the run.
func (m *mixedRun) logExcerpts() string { return logExcerpts(m.all) }

// logExcerpts counts, over procs, the lines that tell the bug apart, with
// a few of them.
func logExcerpts(procs []*proc) string {
	var b strings.Builder
	for _, pat := range []string{"Group consume error", "did not close in time", "i/o timeout", "drain timeout passed", "level=ERROR"} {
		n, withPat := 0, 0
		var ex []string
		for _, p := range procs {
			k := 0
			for _, line := range strings.Split(p.out.String(), "\n") {
				if strings.Contains(line, pat) {
					k++
					if len(ex) < 3 {
						ex = append(ex, fmt.Sprintf("[pid %d] %s", p.cmd.Process.Pid, truncate(line, 300)))
					}
				}
			}
			n += k
			if k > 0 {
				withPat++
			}
		}
		fmt.Fprintf(&b, "\n  %q: %d lines in %d of %d processes", pat, n, withPat, len(procs))
		for _, e := range ex {
			fmt.Fprintf(&b, "\n    %s", e)
		}
	}
	return b.String()
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

func (m *mixedRun) summary(target int) string {
	hung := 0
	var exits []string
	for _, r := range m.shutdowns {
		exits = append(exits, r.String())
		if r.hung {
			hung++
		}
	}
	applied := m.applied()
	return fmt.Sprintf("seed %d: %d of %d published orders applied (%d unapplied); %d SIGTERMs, %d hung past %s:\n  %s\nprogress:\n  %s\nlogs:%s",
		m.seed, applied, target, target-applied, len(m.shutdowns), hung, mixedExitBound,
		strings.Join(exits, "\n  "), strings.Join(m.progress, "\n  "), m.logExcerpts())
}

// waitCaughtUp waits, at most bound from since (and the budget), until
// the group consumes again: target orders applied, and the group stable
// with both live members sharing every partition (one member consuming
// all of them while the other waits to join is a rebalance that did not
// end). It fails the test with the run's summary otherwise.
func (m *mixedRun) waitCaughtUp(what string, target int, since time.Time, bound time.Duration) {
	m.t.Helper()
	last, lastAt := m.applied(), time.Now()
	var caughtUp time.Duration
	group := "not described yet"
	var described time.Time
	members := 0
	ok := waitUntil(m.budget(bound-time.Since(since)), func() bool {
		n := m.applied()
		if n != last {
			last, lastAt = n, time.Now()
		}
		if n < target {
			return false
		}
		if caughtUp == 0 {
			caughtUp = time.Since(since)
		}
		if time.Since(described) < 100*time.Millisecond {
			return false
		}
		described = time.Now()
		var stable bool
		group, stable, members = m.h.kafkaGroupState(len(m.insts))
		return stable
	})
	if !ok {
		if described.IsZero() {
			group, _, members = m.h.kafkaGroupState(len(m.insts))
		}
		m.progress = append(m.progress, fmt.Sprintf("%s: NOT consuming again after %s: %d of %d applied (no progress for %s), group %s",
			what, time.Since(since).Round(100*time.Millisecond), last, target, time.Since(lastAt).Round(100*time.Millisecond), group))
		hint := m.membersHint(members)
		m.t.Fatalf("%s: the group was not consuming again (every published order applied, %d live members sharing the partitions) within %s (session %s + rebalance %s + margin) of the last restart; group %s%s\n%s",
			what, len(m.insts), bound, kafkaSessionTimeout, kafkaRebalanceTimeout, group, hint, m.summary(target))
	}
	m.progress = append(m.progress, fmt.Sprintf("%s: caught up (%d orders) %s and group stable %s after the last restart",
		what, target, caughtUp.Round(100*time.Millisecond), time.Since(since).Round(100*time.Millisecond)))
}

// membersHint explains a group with more members than live processes.
func (m *mixedRun) membersHint(members int) string {
	if members <= len(m.insts) {
		return ""
	}
	hint := fmt.Sprintf(" (%d members for %d live processes: members of dead or abandoned clients are still in the group", members, len(m.insts))
	if m.h.cluster != nil {
		hint += "; note that plain kfake never expires a member that died waiting in JoinGroup/SyncGroup, see DESIGN.md, Brokers"
	}
	return hint + ")"
}

// kafkaGroupState describes the consumer group and reports whether it is
// stable with exactly members members and every partition of the topic
// assigned. It asks with the classic protocol and, if the group is not a
// classic one, the KIP-848 one.
func (h *harness) kafkaGroupState(members int) (desc string, stable bool, n int) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	adm := kadm.NewClient(h.kcl)
	parts := 0
	if td, err := adm.ListTopics(ctx, h.topic); err == nil {
		parts = len(td[h.topic].Partitions)
	}
	describe := func(state string, n int, assigned kadm.TopicsSet) (string, bool, int) {
		got := len(assigned[h.topic])
		return fmt.Sprintf("%s with %d members, %d of %d partitions assigned", state, n, got, parts),
			state == "Stable" && n == members && parts > 0 && got == parts, n
	}
	gs, err := adm.DescribeGroups(ctx, h.group)
	if err != nil {
		return "describe: " + err.Error(), false, 0
	}
	if g, ok := gs[h.group]; ok && g.Err == nil && g.State != "Dead" && g.ProtocolType != "" {
		return describe(g.State, len(g.Members), g.AssignedPartitions())
	}
	cgs, err := adm.DescribeConsumerGroups(ctx, h.group)
	if err != nil {
		return "describe (KIP-848): " + err.Error(), false, 0
	}
	g, ok := cgs[h.group]
	if !ok || g.Err != nil {
		return fmt.Sprintf("not described: %v", g.Err), false, 0
	}
	return describe(g.State, len(g.Members), g.AssignedPartitions())
}

// killMidWork publishes the round's chunk and, once the group is
// certainly mid-work, SIGKILLs a random instance. Mid-work is made, not
// hoped for: the test holds an EXCLUSIVE lock on balances (reads go on,
// the handlers' writes wait) until a claim transaction of some instance
// waits on it; then it kills one of the two instances at random, the one
// with that transaction in flight or the other (which, so soon after the
// previous round's restarts, is most often still starting or joining the
// group), and lets the lock go. An instance taking work is also the sign
// that the group consumes again: if none does within mixedProgressBound
// of the last restart, the group has stopped consuming and the test
// fails. The kill comes a random 0-3 s after the work was seen in flight,
// the lock held meanwhile.
//
// (Killing only the instance with the transaction in flight did not
// reproduce the bug report on HEAD ab58816: in 8 subtest runs every
// SIGTERM exited within 9 s and the group always caught up. A crash that
// meets a deploy hits joining members too; that is what makes a
// rebalance outlast Sarama's 30 s JoinGroup read timeout.)
func (m *mixedRun) killMidWork(round int, ch feedChunk, rng *rand.Rand, lastRestart time.Time) *instance {
	m.t.Helper()
	ctx := context.Background()
	bound := m.budget(mixedProgressBound - time.Since(lastRestart))
	lockCtx, cancel := context.WithTimeout(ctx, bound+5*time.Second)
	defer cancel()
	tx, err := m.h.pool.Begin(lockCtx)
	require.NoError(m.t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(lockCtx, "LOCK TABLE balances IN EXCLUSIVE MODE")
	require.NoError(m.t, err)
	var lockPID int
	require.NoError(m.t, tx.QueryRow(lockCtx, "SELECT pg_backend_pid()").Scan(&lockPID))
	m.h.publishRaw(ch.ids, ch.payloads)

	inFlight := map[*instance]bool{}
	if !waitUntil(bound, func() bool {
		for _, in := range m.insts {
			if m.h.tryCount(`SELECT count(*) FROM pg_stat_activity
WHERE application_name = $1 AND wait_event_type = 'Lock' AND $2 = ANY (pg_blocking_pids(pid))`, in.app, lockPID) > 0 {
				inFlight[in] = true
			}
		}
		return len(inFlight) > 0
	}) {
		_ = tx.Rollback(ctx)
		m.progress = append(m.progress, fmt.Sprintf("round %d: NO instance took work within %s of the last restart",
			round, time.Since(lastRestart).Round(100*time.Millisecond)))
		group, _, members := m.h.kafkaGroupState(len(m.insts))
		m.t.Fatalf("round %d: the group stopped consuming: no instance took work (a claim transaction) within %s of the last restart (session %s + rebalance %s + margin); group %s%s\n%s",
			round, time.Since(lastRestart).Round(100*time.Millisecond), kafkaSessionTimeout, kafkaRebalanceTimeout, group, m.membersHint(members), m.summary(ch.upTo))
	}
	resumed := time.Since(lastRestart)
	// The work stays in flight a random 0-3 s more (a schedule, not a
	// synchronisation): long enough, often, for an instance restarted in
	// the previous round to be waiting in its JoinGroup when the SIGKILL
	// comes.
	hold := time.Duration(rng.Int64N(int64(3 * time.Second)))
	time.Sleep(hold)
	victim := m.insts[rng.IntN(len(m.insts))]
	state := "with a claim transaction in flight"
	if m.h.tryCount(`SELECT count(*) FROM pg_stat_activity
WHERE application_name = $1 AND wait_event_type = 'Lock' AND $2 = ANY (pg_blocking_pids(pid))`, victim.app, lockPID) <= 0 {
		state = "while the other one had a claim transaction in flight"
	}
	m.progress = append(m.progress, fmt.Sprintf("round %d: work resumed %s after the last restart; SIGKILL %s %s after that, %s",
		round, resumed.Round(100*time.Millisecond), victim, hold.Round(100*time.Millisecond), state))
	victim.p.kill()
	require.NoError(m.t, tx.Rollback(ctx))
	return victim
}

// record keeps a shutdown for the summary and logs it, with the end of
// the process's output when it was slow.
func (m *mixedRun) record(r shutdownRecord, p *proc) {
	m.shutdowns = append(m.shutdowns, r)
	if r.took < 5*time.Second {
		m.t.Log(r)
		return
	}
	m.t.Logf("%s; the process's last lines:\n%s", r, outputTail(p.out.String(), 8))
}

// outputTail is the last n lines of s, each cut to 300 bytes.
func outputTail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	lines = lines[max(len(lines)-n, 0):]
	for i, l := range lines {
		lines[i] = "    " + truncate(l, 300)
	}
	return strings.Join(lines, "\n")
}

// testSeed is the seed of a test's random schedule: LOYALTY_TEST_SEED
// when set (to replay a logged one), else a random one.
func testSeed(t *testing.T) uint64 {
	t.Helper()
	if v := os.Getenv("LOYALTY_TEST_SEED"); v != "" {
		seed, err := strconv.ParseUint(v, 10, 64)
		require.NoError(t, err, "LOYALTY_TEST_SEED")
		return seed
	}
	return rand.Uint64()
}

func runMixedRestarts(t *testing.T, h *harness) {
	seed := testSeed(t)
	rng := rand.New(rand.NewPCG(seed, seed^0x5eed))
	m := &mixedRun{t: t, h: h, seed: seed, deadline: time.Now().Add(mixedBudget)}
	t.Logf("seed %d", seed)
	valid, chunks := mixedFeed(t, rng, mixedOrders, mixedBad, mixedRounds+1)
	begin := time.Now()
	defer func() {
		t.Logf("%s\nelapsed %s", m.summary(mixedOrders), time.Since(begin).Round(100*time.Millisecond))
	}()

	m.start(0)
	m.start(1)
	started := time.Now()
	h.publishRaw(chunks[0].ids, chunks[0].payloads)
	m.waitCaughtUp("start", chunks[0].upTo, started, mixedProgressBound)

	// The rounds do not wait for the group to settle: the next SIGKILL
	// comes as soon as an instance has work again, often while the
	// restarted ones are still joining, as in a deploy that meets crashes.
	lastRestart := time.Now()
	for round := 1; round <= mixedRounds; round++ {
		victim := m.killMidWork(round, chunks[round], rng, lastRestart)
		m.start(victim.slot)
		// Within 1-2 s: the restarted one is then most often still
		// joining the group (the killed member's session has not expired
		// yet). A schedule, not a synchronisation.
		delay := time.Second + time.Duration(rng.Int64N(int64(time.Second)))
		time.Sleep(delay)
		target := m.insts[rng.IntN(2)]
		r := target.p.sigterm(fmt.Sprintf("round %d: SIGTERM %s, %s after SIGKILL of instance %d", round, target, delay.Round(time.Millisecond), victim.slot), mixedExitBound, nil)
		m.record(r, target.p)
		if r.hung {
			t.Errorf("round %d: %s did not exit within %s of SIGTERM (DrainTimeout %s + 10s)", round, target, mixedExitBound, drainTimeout)
		}
		m.start(target.slot)
		lastRestart = time.Now()
	}
	m.waitCaughtUp("end", mixedOrders, lastRestart, mixedProgressBound)

	// The bad input is in the poison topic (at least once each: a crash
	// between its publication and the ack sends it again).
	require.Eventually(t, func() bool { return h.poisonCount(t) >= mixedBad }, m.budget(60*time.Second), 50*time.Millisecond,
		"%d bad messages poisoned, want %d", h.poisonCount(t), mixedBad)

	for _, in := range m.insts {
		r := in.p.sigterm(fmt.Sprintf("final: SIGTERM %s", in), mixedExitBound, nil)
		m.record(r, in.p)
		if r.hung {
			t.Errorf("final: %s did not exit within %s of SIGTERM", in, mixedExitBound)
		}
	}
	h.assertExact(valid)
}

// TestKafkaRebalanceWhileHandlerHoldsClaim: member A of the group holds
// order 5's claim transaction open (LOYALTY_HANDLER_DELAY: claim row and
// effect written, not committed) when member B joins. The rebalance does
// not wait for A's handler: every partition is revoked, and whoever gets
// order 5's partition next (B, or A again) reads order 5 again from the
// last committed offset while A's first delivery is still in its
// transaction. That second claim INSERT must wait on A's uncommitted row
// (observed in pg_locks through pg_blocking_pids), and when A commits it
// records a duplicate: order 5 is credited exactly once and every balance
// is exact. A holds for 20s: the second delivery must come inside that
// hold (3.1s in a CI run), and the claim wait is raised above it, so it
// waits once instead of failing its claim transaction with claim_wait.
func TestKafkaRebalanceWhileHandlerHoldsClaim(t *testing.T) {
	t.Parallel()
	h := newHarness(t, "kafka")
	all := orders(1, 30)
	const held = 5

	a := h.start("LOG_LEVEL=debug", "LOYALTY_HANDLER_DELAY=20s", fmt.Sprintf("LOYALTY_HANDLER_DELAY_ORDER=%d", held), "CLAIM_MAX_CLAIM_WAIT=40s")
	h.publish(all[:20]...)
	a.waitLog(t, fmt.Sprintf(`msg="loyalty: fault injection: holding the claim transaction open" order_id=%d`, held))
	holdStart := time.Now()
	b := h.start("LOG_LEVEL=debug", "CLAIM_MAX_CLAIM_WAIT=40s")

	// The overlap: the second delivery's claim of the held order waits
	// behind A's open transaction, which is idle in transaction (sleeping
	// in the handler).
	h.waitFor("a second claim of the held order to wait on A's uncommitted claim row", func() bool {
		return h.tryCount(`
SELECT count(*)
FROM pg_stat_activity w
JOIN pg_stat_activity blocker ON blocker.pid = ANY (pg_blocking_pids(w.pid))
WHERE w.wait_event_type = 'Lock'
  AND w.query LIKE '%' || $1 || '%processed_messages%'
  AND blocker.state = 'idle in transaction'`, h.schema) > 0
	})
	t.Logf("a second claim blocked on A's %s after A began holding it", time.Since(holdStart).Round(time.Millisecond))
	require.Zero(t, h.count("SELECT count(*) FROM point_ledger WHERE order_id = $1", held),
		"order %d is not committed while A holds it", held)

	// A commits, the second delivery finds the claim and acks a duplicate.
	// A logs its outcome after its COMMIT returns, and the waiting INSERT
	// is released by that same COMMIT, so either line can come first.
	a.waitLog(t, fmt.Sprintf(`msg="loyalty: fault injection: committing the held claim transaction" order_id=%d`, held))
	a.waitLog(t, fmt.Sprintf(`msg="loyalty: outcome" order_id=%d outcome=applied`, held))
	duplicate := fmt.Sprintf(`msg="loyalty: outcome" order_id=%d outcome=duplicate`, held)
	h.waitFor("the second delivery's duplicate", func() bool {
		return strings.Contains(a.out.String(), duplicate) || strings.Contains(b.out.String(), duplicate)
	})
	require.NotContains(t, b.out.String(), fmt.Sprintf(`order_id=%d outcome=applied`, held))
	require.Equal(t, 1, strings.Count(a.out.String(), fmt.Sprintf(`order_id=%d outcome=applied`, held)))

	// The group goes on with both members.
	h.publish(all[20:]...)
	h.waitApplied(len(all))
	h.waitFor("every claim", func() bool {
		return h.tryCount(fmt.Sprintf(`SELECT count(*) FROM %q.processed_messages`, h.schema)) == len(all)
	})
	require.Equal(t, 1, h.count("SELECT count(*) FROM point_ledger WHERE order_id = $1", held))
	h.assertExact(all)
	for _, p := range []*proc{a, b} {
		got := p.outcomes(t)
		require.Zero(t, got["failed"]+got["poisoned"], "outcomes: %v", got)
	}
	require.True(t, a.running(), "A is still running")
	require.True(t, b.running(), "B is still running")
}
