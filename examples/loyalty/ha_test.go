//go:build ha

package main

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/internal/testenv"
)

// Tests in this file run the loyalty consumer on the .ci/ha cluster (make
// test-ha): DATABASE_URL is the multi-host URL with
// target_session_attrs=read-write, and the tests fail the leader over
// under it. Each leaves the cluster healthy and asynchronous. Not
// parallel: they share the cluster and time its failovers.

// haDisruption is what happens to the cluster mid-run; it returns the old
// leader.
type haDisruption struct {
	name string
	// synchronous turns Patroni's synchronous_mode on for the run: a
	// killed leader's acknowledged commits are on the replica. Without it
	// a failover may lose acked orders (TestHAAsyncFailoverLosesAckedCommit
	// in store shows it), which this test would count as lost.
	synchronous bool
	do          func(t *testing.T, ha *testenv.HACluster) string
}

var (
	haKillLeader = haDisruption{"kill the leader's postmaster", true,
		func(t *testing.T, ha *testenv.HACluster) string { return ha.KillLeader(t) }}
	// The leader's machine lost: the replica takes over when the leader
	// key expires (ttl). The node comes back at the test's end.
	haKillNode = haDisruption{"lose the leader's machine", true,
		func(t *testing.T, ha *testenv.HACluster) string { return ha.KillLeaderNode(t) }}
	// A planned switchover: the old leader shuts down only once its replica
	// has all of its WAL, so asynchronous replication loses nothing.
	haSwitchover = haDisruption{"switchover", false,
		func(t *testing.T, ha *testenv.HACluster) string { return ha.Switchover(t) }}
)

// TestHAConsumerFollowsFailover: a consumer process publishes on,
// orders stream in, and the leader fails over under it (its postmaster
// SIGKILLed, or a planned switchover). The consumer is not restarted: its
// claims fail on the lost connections, are retried or nacked (never
// poisoned) and commit on the new leader. Every order is credited exactly
// once. The time from the disruption to the first commit on the new
// leader is logged.
func TestHAConsumerFollowsFailover(t *testing.T) {
	batch := []string{"BATCH_SIZE=16", "BATCH_WORKERS=2"}
	cases := []struct {
		kind string
		d    haDisruption
		env  []string
	}{
		{"amqp", haKillLeader, nil},
		{"amqp", haSwitchover, nil},
		{"amqp", haKillNode, nil},
		{"amqp", haKillLeader, batch},
		{"kafka", haKillLeader, nil},
		{"kafka", haSwitchover, nil},
	}
	for _, c := range cases {
		mode := "per-message"
		if c.env != nil {
			mode = "batch"
		}
		t.Run(c.kind+"/"+mode+"/"+c.d.name, func(t *testing.T) {
			haFollow(t, c.kind, c.d, c.env...)
		})
	}
}

func haFollow(t *testing.T, kind string, d haDisruption, env ...string) {
	ha := testenv.HA(t)
	ha.Use(t)
	if d.synchronous {
		ha.SetSynchronous(t, true)
	}
	// The defaults a user runs: Kafka's session and rebalance timeouts
	// included.
	h := newHarnessWith(t, kind, harnessOptions{defaultKafkaTimeouts: true})
	if len(env) == 0 {
		// 5 ms in each claim transaction, 4 at a time, so transactions
		// are in flight when the leader goes (batch mode has no such
		// delay: its batches are in flight anyway).
		env = []string{"LOYALTY_HANDLER_DELAY=5ms"}
	}
	p := h.start(env...)
	p.metricsURL(t) // started: the address is logged once start-up is done

	const batch = 20
	var all []order
	var disruptedAt, settled time.Time
	var firstCommit chan time.Time
	for after := 0; after < 10; {
		next := orders(len(all)+1, batch)
		h.publish(next...)
		all = append(all, next...)
		if disruptedAt.IsZero() && len(all) == 5*batch {
			disruptedAt = time.Now()
			old := d.do(t, ha)
			// A switchover returns once the new leader is promoted, the
			// old one shut down; a kill returns at once.
			settled = time.Now()
			t.Logf("%s: %s was the leader (%v)", d.name, old, settled.Sub(disruptedAt).Round(time.Millisecond))
			firstCommit = haWatchFirstCommit(t, h, settled)
		} else if !disruptedAt.IsZero() {
			after++
		}
		// Keep at most two batches of backlog, so orders are still
		// arriving when the leader goes and after.
		h.waitApplied(len(all) - 2*batch)
	}

	select {
	case at := <-firstCommit:
		t.Logf("%s: the first commit on the new leader %v after it began", d.name, at.Sub(disruptedAt).Round(time.Millisecond))
	case <-time.After(2 * time.Minute):
		require.Fail(t, "no commit on the new leader")
	}
	h.waitApplied(len(all))
	ha.WaitHealthy(t)
	h.waitFor("every claim", func() bool {
		return h.tryCount(fmt.Sprintf(`SELECT count(*) FROM %q.processed_messages`, h.schema)) == len(all)
	})
	h.assertExact(all)
	require.True(t, p.running(), "the consumer followed the new leader instead of exiting:\n%s", p.out.String())
	got := p.outcomes(t)
	require.Zero(t, got["poisoned"], "outcomes: %v", got)
	// Each order ends applied or, when its COMMIT succeeded but the reply
	// was lost with the leader, failed and then, redelivered, duplicate:
	// the claim tells the truth about the ambiguous commit.
	require.Equal(t, len(all), got["applied"]+got["duplicate"], "outcomes: %v", got)
	if kind == "amqp" {
		require.Zero(t, h.queueDepth(h.topic+".poison"), "nothing poisoned")
		h.waitFor("the queue to drain", func() bool { return h.queueDepth(h.topic) == 0 })
	}
	t.Logf("outcomes: %v (failed: claims that gave up on the lost leader and were nacked; duplicate: commits whose reply was lost)", got)
}

// haWatchFirstCommit polls, through the multi-host pool, for the first
// claim whose transaction began after since: one the old leader cannot
// have committed (now() is the transaction's start, on this machine's
// clock). It sends when it saw that claim.
func haWatchFirstCommit(t *testing.T, h *harness, since time.Time) chan time.Time {
	found := make(chan time.Time, 1)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); <-done })
	q := fmt.Sprintf(`SELECT count(*) FROM %q.processed_messages WHERE processed_at > $1`, h.schema)
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			var n int
			if err := h.pool.QueryRow(ctx, q, since).Scan(&n); err == nil && n > 0 {
				found <- time.Now()
				return
			}
			select {
			case <-ctx.Done():
			case <-time.After(10 * time.Millisecond):
			}
		}
	}()
	return found
}

// TestHAStartupWaitsForLeader: the consumer starts while the cluster has
// no leader (the leader's machine lost: Patroni and Postgres SIGKILLed;
// the replica takes over once the leader key expires, ttl 10 s). At the
// default STARTUP_TIMEOUT (30 s) it waits for the new leader, says so,
// and starts.
func TestHAStartupWaitsForLeader(t *testing.T) {
	ha := testenv.HA(t)
	ha.Use(t)
	h := newHarness(t, "amqp")
	old := ha.KillLeaderNode(t)
	killed := time.Now()
	p := h.start()
	// It waited for PostgreSQL (the replica refuses: read only; the old
	// leader's address: refused), then started.
	p.waitLog(t, `msg="claimtx: start-up: waiting for dependency" dependency=PostgreSQL`)
	p.metricsURL(t)
	started := time.Since(killed)
	require.NotEqual(t, old, ha.Leader(context.Background()), "the old leader is dead")
	h.publish(orders(1, 20)...)
	h.waitApplied(20)
	h.assertExact(orders(1, 20))
	require.True(t, p.running())
	t.Logf("started %v after the leader's machine was lost", started.Round(time.Millisecond))
	ha.StartNode(t, old)
	ha.WaitHealthy(t)
}
