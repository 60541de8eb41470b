package main

import (
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/internal/testenv"
)

// TestColdStartProcesses starts several loyalty processes at once on an
// empty database, as the replicas of a first deploy do, over many rounds
// and in both modes: every one must get to consuming and stop cleanly on
// SIGTERM. Separate processes matter: each has its own pool, hence its own
// backends and catalog caches, and the start-up DDL (the example's tables,
// claimtx's migrations) races across them.
func TestColdStartProcesses(t *testing.T) {
	coldStartRounds(t, 16, func(u string) string { return u })
}

// TestColdStartProcessesPgBouncer is the same through a PgBouncer in
// transaction mode with DATABASE_URL as a pgx user behind it writes it
// (default_query_exec_mode=exec): the example's table creation and
// claimtx's migrations keep no session state, so replicas of a first
// deploy start there too (issue 29: one of two crashed with the session
// advisory lock).
func TestColdStartProcessesPgBouncer(t *testing.T) {
	coldStartRounds(t, 8, testenv.ThroughPgBouncer(t))
}

// coldStartRounds runs rounds rounds of 3 processes, every other one in
// batch mode, and fails the test if any process failed.
func coldStartRounds(t *testing.T, rounds int, consumerURL func(string) string) {
	const procs = 3
	failures := 0
	for round := range rounds {
		batchSize := "0"
		if round%2 == 1 {
			batchSize = "8"
		}
		failures += coldStartRound(t, round, procs, batchSize, consumerURL)
	}
	t.Logf("%d of %d loyalty processes failed", failures, rounds*procs)
	require.Zero(t, failures, "processes that failed to start or stop cleanly")
}

// coldStartRound runs one round on a new database and a new queue, the
// processes connecting to consumerURL(its URL), and returns how many
// processes failed.
func coldStartRound(t *testing.T, round, procs int, batchSize string, consumerURL func(string) string) int {
	t.Helper()
	dbURL := consumerURL(testenv.NewDatabase(t))
	topic := "loyalty-coldstart-" + randID()
	(&harness{t: t, amqpURL: amqpURL}).deleteQueuesAtCleanup(topic, topic+".poison")
	env := append(os.Environ(),
		"BROKER=amqp", "AMQP_URL="+amqpURL, "TOPIC="+topic, "DATABASE_URL="+dbURL,
		"CLAIMTX_SCHEMA=", // the default schema, absent on a new database
		"METRICS_ADDR=off", "BATCH_SIZE="+batchSize, "LOG_LEVEL=info")
	ps := make([]*proc, procs)
	for i := range ps {
		ps[i] = startProc(t, env)
	}
	failed := 0
	started := make([]bool, procs)
	for i, p := range ps {
		if err := awaitConsumingOrExit(p, 60*time.Second); err != nil {
			failed++
			t.Errorf("round %d (BATCH_SIZE=%s), process %d: %v\n%s", round, batchSize, i, err, p.out.String())
			continue
		}
		started[i] = true
	}
	for _, p := range ps {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
	}
	for i, p := range ps {
		if !p.exited(30 * time.Second) {
			p.kill()
		}
		if started[i] && p.err != nil {
			failed++
			t.Errorf("round %d (BATCH_SIZE=%s), process %d: did not stop cleanly on SIGTERM: %v\n%s", round, batchSize, i, p.err, p.out.String())
		}
	}
	return failed
}

// awaitConsumingOrExit waits until the process logs that it consumes, or
// exits (an error), whichever comes first.
func awaitConsumingOrExit(p *proc, within time.Duration) error {
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(within)
	for {
		if strings.Contains(p.out.String(), "loyalty: consuming") {
			return nil
		}
		select {
		case <-p.done:
			if strings.Contains(p.out.String(), "loyalty: consuming") {
				return nil
			}
			return fmt.Errorf("exited before consuming: %w", p.err)
		case <-deadline:
			return fmt.Errorf("not consuming within %s", within)
		case <-tick.C:
		}
	}
}
