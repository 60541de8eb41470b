//go:build disruptive

package chaos

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/internal/testenv"
)

// TestChaosDisruptive is `make chaos-ci` as a test: 2,000 orders per
// broker, 3 consumers started at once on a fresh database, at least 3
// SIGKILLs and 3 SIGTERM rolling restarts, on Kafka also at least 3
// SIGTERMs of a consumer still starting (joining the group) and 3 of one
// 1-2 s after another's SIGKILL, one Postgres restart, one broker
// disruption (every RabbitMQ connection closed; the dev Kafka broker
// restarted on its data directory). The Kafka consumers run with the
// example's default session and rebalance timeouts; a SIGTERMed consumer
// must exit within the drain timeout plus 5 s. BATCH_SIZE in the
// environment runs the consumers in batch mode, as make chaos-batch does.
// It disturbs only servers and connections of its own: Postgres is a
// private cluster (testenv.StartPGCluster) and RabbitMQ closes only the
// run's connections, by name. It runs under the disruptive tag, serially,
// after the parallel suite (make test-disruptive), for its load and length.
func TestChaosDisruptive(t *testing.T) {
	chaosCI(t, false)
}

// TestChaosPgBouncerDisruptive is TestChaosDisruptive with the consumers
// behind a PgBouncer of the run's own in transaction mode, in front of the
// private cluster (DATABASE_URL with default_query_exec_mode=exec, as a
// pgx user behind PgBouncer writes it): the cold start races the
// migrations and the example's tables through it, the Postgres restart
// breaks PgBouncer's server connections under the consumers, and the
// result must be the same: lost 0, doubled 0, crashes 0. make
// chaos-pgbouncer is the full run.
func TestChaosPgBouncerDisruptive(t *testing.T) {
	chaosCI(t, true)
}

func chaosCI(t *testing.T, pgbouncer bool) {
	testenv.RequireTool(t, "rabbitmqctl")
	bin := t.TempDir()
	build := func(out, pkg string) string {
		path := filepath.Join(bin, out)
		cmd := exec.Command("go", "build", "-o", path, pkg)
		cmd.Dir = "../.."
		b, err := cmd.CombinedOutput()
		require.NoError(t, err, "go build %s: %s", pkg, b)
		return path
	}
	o := defaults()
	o.loyalty = build("loyalty", "./examples/loyalty")
	o.devkafka = build("devkafka", "./framework/cmd/devkafka")
	o.orders, o.bad, o.minKills, o.minTerms = 2000, 5, 3, 3
	o.minStartTerms, o.minKillTerms = 3, 3
	o.timeout = 5 * time.Minute
	usePrivatePostgres(t, &o)
	o.pgbouncer = pgbouncer
	usePgBouncer(t, &o)
	o.logDir = t.TempDir()
	var out syncBuffer
	o.out = &out

	start := time.Now()
	reports, err := run(context.Background(), o)
	t.Logf("chaos output (%s):\n%s", time.Since(start).Round(time.Second), out.String())
	require.NoError(t, err)
	require.Len(t, reports, 2)
	for _, r := range reports {
		if !r.ok() {
			dumpLogs(t, o.logDir)
		}
		require.True(t, r.ok(), r.summary())
		require.Zero(t, r.lost)
		require.Zero(t, r.doubled)
		require.Zero(t, r.misPoisoned, "valid orders in the poison destination")
		require.Zero(t, r.crashes, "consumers that exited by themselves or non-zero after SIGTERM")
		require.Zero(t, r.hung, "consumers still running the drain timeout + 5 s after SIGTERM")
		require.Zero(t, r.stuck)
		require.Equal(t, r.bad, r.badPoisoned)
		require.Equal(t, r.orders, r.ledgerRows)
		require.Equal(t, r.expectedPts, r.gotPts)
		require.GreaterOrEqual(t, r.kills, 3)
		require.GreaterOrEqual(t, r.terms, 3)
		if r.broker == "kafka" {
			require.GreaterOrEqual(t, r.startTerms, 3, "SIGTERMs of consumers still starting")
			require.GreaterOrEqual(t, r.killTerms, 3, "SIGTERMs 1-2 s after a SIGKILL")
		}
		require.Equal(t, 1, r.pgRestarts)
		require.Equal(t, 1, r.brokerDisruptions)
	}
	if pgbouncer {
		require.Positive(t, pgbouncerTransactions(t, o.pgbouncerHost, "chaos_"), "transactions PgBouncer served to the runs' databases")
	}
	// RabbitMQ takes about a minute; Kafka, at the default timeouts, a
	// few: every SIGKILL holds the group's rebalance until the dead
	// member's 10 s session expires.
	require.Less(t, time.Since(start), 8*time.Minute, "the CI chaos run must stay under 8 minutes")
}

// pgbouncerTransactions is how many transactions the PgBouncer at host
// served to databases named prefix…, from its admin console (SHOW STATS):
// proof that the consumers went through it.
func pgbouncerTransactions(t *testing.T, host, prefix string) int64 {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// The admin console speaks only the simple protocol.
	conn, err := pgx.Connect(ctx, "postgres://postgres@"+host+"/pgbouncer?sslmode=disable&default_query_exec_mode=simple_protocol")
	require.NoError(t, err)
	defer func() { _ = conn.Close(ctx) }()
	rows, err := conn.Query(ctx, "SHOW STATS")
	require.NoError(t, err)
	defer rows.Close()
	dbCol, xactCol := -1, -1
	for i, f := range rows.FieldDescriptions() {
		switch f.Name {
		case "database":
			dbCol = i
		case "total_xact_count":
			xactCol = i
		}
	}
	require.True(t, dbCol >= 0 && xactCol >= 0, "SHOW STATS columns: %v", rows.FieldDescriptions())
	var total int64
	for rows.Next() {
		// The simple protocol's text, whatever type PgBouncer declares.
		raw := rows.RawValues()
		name := string(raw[dbCol])
		if !strings.HasPrefix(name, prefix) {
			continue
		}
		n, err := strconv.ParseInt(string(raw[xactCol]), 10, 64)
		require.NoError(t, err)
		t.Logf("PgBouncer served %d transactions to %s", n, name)
		total += n
	}
	require.NoError(t, rows.Err())
	return total
}

func dumpLogs(t *testing.T, dir string) {
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			continue
		}
		if len(b) > 4000 {
			b = b[len(b)-4000:]
		}
		t.Logf("--- %s (tail):\n%s", e.Name(), b)
	}
}

// syncBuffer collects a subprocess's output while it runs.
type syncBuffer = testenv.Output
