package main

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/internal/testenv"
)

// TestColdStartProcesses starts several `receipts all` processes at once on
// an empty database, over several rounds: each runs the orders consumer,
// the relay and the sender, so each process's three pools race to create
// the example's tables and migrate claimtx's schema. Every role of every
// process must get to running and stop cleanly on SIGTERM.
func TestColdStartProcesses(t *testing.T) {
	t.Parallel()
	coldStart(t, 6, func(u string) string { return u })
}

// TestColdStartProcessesPgBouncer is the same race through a PgBouncer in
// transaction mode: the tables and the schema are created without a
// session, and the relay, which cannot LISTEN there, polls.
func TestColdStartProcessesPgBouncer(t *testing.T) {
	t.Parallel()
	coldStart(t, 3, testenv.ThroughPgBouncer(t), "receipts: behind a transaction pooler, the relay polls")
}

// coldStart runs rounds of three `receipts all` processes on a new
// database each, reached at dbURL(its URL); each process must log every
// running line and want, and stop cleanly on SIGTERM.
func coldStart(t *testing.T, rounds int, dbURL func(string) string, want ...string) {
	const procs = 3
	running := append([]string{"receipts: orders consumer running", "receipts: relay running", "receipts: sender consumer running"}, want...)
	brokerConfig := filepath.Join(t.TempDir(), "broker.yaml")
	// Queues unique to each round, deleted by RabbitMQ a minute after last use.
	require.NoError(t, os.WriteFile(brokerConfig, []byte("kind: amqp\namqp:\n  queue_arguments:\n    x-expires: 60000\n"), 0o600))
	failures := 0
	for round := range rounds {
		run := watermill.NewShortUUID()
		w := world{t: t, env: []string{
			"DATABASE_URL=" + dbURL(testenv.NewDatabase(t)),
			"CLAIMTX_SCHEMA=", // the default schema, absent on a new database
			"BROKER_CONFIG=" + brokerConfig,
			"ORDERS_TOPIC=claimtx-test-coldstart-orders-" + run,
			"RECEIPTS_TOPIC=claimtx-test-coldstart-send-" + run,
			"PROVIDER_URL=http://" + freeAddr(t), // never called: no order is published
		}}
		ps := make([]*proc, procs)
		for i := range ps {
			ps[i] = w.start(nil, "all")
		}
		started := make([]bool, procs)
		for i, p := range ps {
			ok := false
			require.Eventually(t, func() bool {
				out := p.out.String()
				ok = true
				for _, r := range running {
					ok = ok && strings.Contains(out, r)
				}
				select {
				case <-p.done:
					return true // exited: checked below
				default:
					return ok
				}
			}, time.Minute, 10*time.Millisecond, "round %d, process %d: neither running nor exited", round, i)
			if !ok {
				failures++
				t.Errorf("round %d, process %d exited before running: %v\n%s", round, i, p.err, p.out.String())
			}
			started[i] = ok
		}
		for _, p := range ps {
			_ = p.cmd.Process.Signal(syscall.SIGTERM)
		}
		for i, p := range ps {
			p.wait(30 * time.Second)
			if started[i] && p.err != nil {
				failures++
				t.Errorf("round %d, process %d did not stop cleanly on SIGTERM: %v\n%s", round, i, p.err, p.out.String())
			}
		}
	}
	t.Logf("%d of %d receipts processes failed", failures, rounds*procs)
}
