package consumer

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/internal/testenv"
	"github.com/claimtx/claimtx/store"
)

// TestClaimPrivilegeCheckWaitsForPostgres: the start-up privilege checks
// after the migration (poison memo, Kafka positions) wait for PostgreSQL
// under the start-up policy, as the migration does: a restart between the
// two (seen in the chaos run through PgBouncer: "check privileges on
// kafka_positions: FATAL: terminating connection due to administrator
// command") is waited out, not a crash.
func TestClaimPrivilegeCheckWaitsForPostgres(t *testing.T) {
	t.Parallel()
	cluster := testenv.StartPGCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pool, err := pgxpool.New(ctx, cluster.URL("postgres"))
	require.NoError(t, err)
	defer pool.Close()
	st, err := store.New(pool, store.Config{})
	require.NoError(t, err)
	require.NoError(t, st.Migrate(ctx))
	require.NoError(t, cluster.Stop(ctx))

	var logs testenv.Output
	p := &parts{cfg: Config{StartupTimeout: time.Minute, Logger: slog.New(slog.NewTextHandler(&logs, nil))}, pool: pool, store: st}
	restarted := make(chan error, 1)
	go func() {
		// Only once the check has found Postgres down and waits.
		for !strings.Contains(logs.String(), "waiting for dependency") {
			select {
			case <-ctx.Done():
				restarted <- ctx.Err()
				return
			case <-time.After(10 * time.Millisecond):
			}
		}
		restarted <- cluster.Restart(ctx)
	}()
	require.NoError(t, p.requireClaimPrivileges(ctx, "Claim.PoisonMemo", p.names().Memo, "uses", "memo"))
	require.NoError(t, <-restarted)
	require.Contains(t, logs.String(), "check privileges on "+p.names().Memo)
}
