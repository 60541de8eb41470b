package main

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

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
