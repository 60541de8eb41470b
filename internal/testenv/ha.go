package testenv

// The replicated cluster of the failover tests (build tag ha, make
// test-ha): two Patroni-managed Postgres nodes of the repository's .ci/ha.
// Starting it costs seconds, so unlike StartPGCluster's it outlives a test.

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// haNodes are .ci/ha's nodes, on Postgres ports 5433 and up.
var haNodes = []string{"pg1", "pg2"}

// HACluster is the .ci/ha cluster: nodes pg1 (127.0.0.1:5433) and pg2
// (127.0.0.1:5434), trust authentication, superuser postgres.
type HACluster struct {
	script string
	url    string
}

// HA starts the .ci/ha cluster unless it is up and returns it. When the
// test ends both nodes run again, asynchronous, a leader streaming to its replica.
func HA(t testing.TB) *HACluster {
	t.Helper()
	script, err := ciScript("ha")
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	c := &HACluster{script: script}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	// Restored before the test too: a run interrupted mid-test must not
	// hand the next one a synchronous cluster or a frozen walsender.
	if err := c.restore(ctx); err != nil {
		t.Fatalf("testenv: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		if err := c.restore(ctx); err != nil {
			t.Errorf("testenv: restoring the HA cluster: %v", err)
		}
	})
	return c
}

// restore starts what is not running (a killed node), thaws a frozen
// walsender, waits for a streaming replica (up) and turns synchronous_mode off.
func (c *HACluster) restore(ctx context.Context) error {
	out, err := c.run(ctx, "up")
	if err != nil {
		return err
	}
	c.url = strings.TrimSpace(out)
	_, err = c.run(ctx, "sync", "off")
	return err
}

// URL is the multi-host URL a client follows the leader with
// (target_session_attrs=read-write), database postgres.
func (c *HACluster) URL() string { return c.url }

// NodeURL is one node's own address (pg1 or pg2), whatever its role.
func (c *HACluster) NodeURL(node string) string {
	if i := slices.Index(haNodes, node); i >= 0 {
		return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", 5433+i)
	}
	return ""
}

// Use points this test's TEST_DATABASE_URL at the cluster, so that Setup
// and the rest work on it. Not for parallel tests (t.Setenv).
func (c *HACluster) Use(t testing.TB) {
	t.Helper()
	t.Setenv("TEST_DATABASE_URL", c.url)
}

// Leader returns the node whose Postgres is not in recovery, "" when
// neither is (mid-failover) or neither answers.
func (c *HACluster) Leader(ctx context.Context) string {
	for _, n := range haNodes {
		var primary bool
		if c.query(ctx, n, "SELECT NOT pg_is_in_recovery()", &primary) == nil && primary {
			return n
		}
	}
	return ""
}

// WaitLeader waits for a leader other than not ("" for any) that takes
// writes (assigns a transaction id), and returns its name.
func (c *HACluster) WaitLeader(ctx context.Context, not string) (string, error) {
	var leader string
	err := poll(ctx, 50*time.Millisecond, func() bool {
		for _, n := range haNodes {
			var xid string
			if n != not && c.query(ctx, n, "SELECT pg_current_xact_id()::text", &xid) == nil {
				leader = n
				return true
			}
		}
		return false
	})
	if err != nil {
		return "", fmt.Errorf("testenv: no writable leader (other than %q): %w", not, err)
	}
	return leader, nil
}

// poll calls done every interval until it reports true (nil) or ctx ends.
func poll(ctx context.Context, interval time.Duration, done func() bool) error {
	for !done() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(interval):
		}
	}
	return nil
}

// WaitReplicated waits until the replica has replayed everything the
// leader had written when it was called.
func (c *HACluster) WaitReplicated(t testing.TB) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	leader, err := c.WaitLeader(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	var target string
	if err := c.query(ctx, leader, "SELECT pg_current_wal_lsn()::text", &target); err != nil {
		t.Fatalf("testenv: WAL position of %s: %v", leader, err)
	}
	var qerr error
	if poll(ctx, 20*time.Millisecond, func() bool {
		var done bool
		qerr = c.query(ctx, leader, "SELECT coalesce(bool_and(replay_lsn >= $1::pg_lsn), false) FROM pg_stat_replication", &done, target)
		return qerr == nil && done
	}) != nil {
		t.Fatalf("testenv: the replica never replayed %s: %v", target, qerr)
	}
}

// WaitHealthy starts a node that is down (after KillLeaderNode) and
// waits for a leader with its replica streaming.
func (c *HACluster) WaitHealthy(t testing.TB) {
	t.Helper()
	c.must(t, "up")
}

// KillLeader SIGKILLs the leader's postmaster and its children: Patroni
// (primary_start_timeout 0) fails over to the replica, then brings the old
// leader back as a replica. It returns the old leader.
func (c *HACluster) KillLeader(t testing.TB) string {
	t.Helper()
	return c.must(t, "failover")
}

// KillLeaderNode SIGKILLs the leader's Patroni and postgres, as when its
// machine is lost: the replica takes over once the leader key expires (ttl,
// 10 s). It returns the killed node; StartNode (or the test's end) restarts it.
func (c *HACluster) KillLeaderNode(t testing.TB) string {
	t.Helper()
	return c.must(t, "kill-node")
}

// StartNode starts a node's Patroni again after KillLeaderNode.
func (c *HACluster) StartNode(t testing.TB, node string) {
	t.Helper()
	c.must(t, "start-node", node)
}

// Switchover moves the leadership to the replica (Patroni's planned
// switchover: the leader stops once the replica has all its WAL) and
// returns the old leader.
func (c *HACluster) Switchover(t testing.TB) string {
	t.Helper()
	old := c.Leader(context.Background())
	c.must(t, "switchover")
	return old
}

// SetSynchronous turns Patroni's synchronous_mode on (not strict: with no
// standby the leader commits alone) or off, and waits for the replica's sync_state.
func (c *HACluster) SetSynchronous(t testing.TB, on bool) {
	t.Helper()
	c.must(t, "sync", map[bool]string{true: "on", false: "off"}[on])
}

// FreezeReplication SIGSTOPs the leader's walsender: from then on the
// replica receives nothing, while the leader carries on. thaw SIGCONTs it
// (the test's end does too); killing the leader's postgres kills it.
func (c *HACluster) FreezeReplication(t testing.TB) (thaw func()) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	leader := c.Leader(ctx)
	if leader == "" {
		t.Fatal("testenv: no leader to freeze replication on")
	}
	var pid int
	if err := c.query(ctx, leader, "SELECT pid FROM pg_stat_replication WHERE state = 'streaming'", &pid); err != nil {
		t.Fatalf("testenv: the walsender on %s: %v", leader, err)
	}
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatalf("testenv: SIGSTOP walsender %d: %v", pid, err)
	}
	thaw = func() { _ = syscall.Kill(pid, syscall.SIGCONT) }
	t.Cleanup(thaw)
	return thaw
}

// query scans sql's one value on node into dst.
func (c *HACluster) query(ctx context.Context, node, sql string, dst any, args ...any) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, c.NodeURL(node))
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close(context.Background()) }()
	return conn.QueryRow(ctx, sql, args...).Scan(dst)
}

func (c *HACluster) must(t testing.TB, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	out, err := c.run(ctx, args...)
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	return strings.TrimSpace(out)
}

// run runs .ci/ha with args and returns its stdout (its log, stderr, is in the error).
func (c *HACluster) run(ctx context.Context, args ...string) (string, error) {
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, "bash", append([]string{c.script}, args...)...) //nolint:gosec // the repository's own script
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	// The servers it starts must not die with the test's process group
	// when go test is interrupted: they are shared by the next run.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf(".ci/ha %s: %w\n%s%s", strings.Join(args, " "), err, stdout.String(), stderr.String())
	}
	return stdout.String(), nil
}
