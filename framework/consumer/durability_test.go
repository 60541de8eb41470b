package consumer_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/brokers"
	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/framework/consumer"
	"github.com/claimtx/claimtx/internal/testenv"
	"github.com/claimtx/claimtx/middleware"
)

// noSyncStandby is what the warning says when the server has no
// synchronous standby configured, as the machine's server has not.
const noSyncStandby = "synchronous_standby_names is empty: commits are acknowledged without a synchronous standby: a failover can lose acknowledged effects"

// A consumer whose claims commit with remote_write or remote_apply on a
// server without a synchronous standby starts, and says so: one WARN line
// naming the setting and what is missing, and a warning in its readiness
// report (ready all the same: the standby may come back). Settings that
// need no standby say nothing.
func TestSynchronousCommitWithoutStandbyWarns(t *testing.T) {
	t.Parallel()
	pool, schema := testenv.Setup(t, 4)
	for _, tc := range []struct {
		setting string
		warns   bool
	}{
		{"remote_apply", true}, {"remote_write", true}, {"on", false}, {"", false}, {"local", false},
	} {
		var logs testenv.Output
		cfg := baseConfig("sync", "sync-"+randHex(), pool, schema, goChannel(schema+randHex()))
		cfg.Claim.SynchronousCommit = tc.setting
		cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
		c, err := consumer.New(t.Context(), cfg, noop)
		require.NoError(t, err, tc.setting)
		rep := c.Health().Check(t.Context())
		require.True(t, rep.Ready, "%q: %v", tc.setting, rep.Checks)
		if tc.warns {
			require.Contains(t, logs.String(), "level=WARN msg=\"claimtx: synchronous_commit "+tc.setting+" needs a synchronous standby, but "+noSyncStandby+"\"", tc.setting)
			require.Contains(t, logs.String(), "synchronous_commit="+tc.setting, tc.setting)
			require.Equal(t, "warning: synchronous_commit "+tc.setting+" needs a synchronous standby, but "+noSyncStandby, rep.Checks["synchronous_standby"], tc.setting)
		} else {
			require.NotContains(t, logs.String(), "standby", tc.setting)
			require.NotContains(t, rep.Checks, "synchronous_standby", tc.setting)
		}
		require.NoError(t, c.Close())
	}

	cfg := baseConfig("sync", "sync-"+randHex(), pool, schema, goChannel(schema+randHex()))
	cfg.Claim.SynchronousCommit = "off"
	_, err := consumer.New(t.Context(), cfg, noop)
	ce := requireConfigError(t, err, "Claim.SynchronousCommit")
	require.Contains(t, ce.Reason, "refused")
}

// The readiness report carries both sources of warnings at once: the
// retention horizon's and the synchronous standby's.
func TestReadinessWarningsCombine(t *testing.T) {
	t.Parallel()
	pool, schema := testenv.Setup(t, 4)
	cfg := baseConfig("sync", "sync-"+randHex(), pool, schema,
		brokers.Config{Kind: brokers.KindAMQP, AMQP: brokers.AMQPConfig{URL: "amqp://guest:guest@127.0.0.1:5672/"}})
	cfg.Claim.EventTime, cfg.Retention = eventTime(t), 2*time.Hour
	cfg.Claim.SynchronousCommit = "remote_apply"
	c, err := consumer.New(t.Context(), cfg, noop)
	require.NoError(t, err)
	defer func() { require.NoError(t, c.Close()) }()
	rep := c.Health().Check(t.Context())
	require.True(t, rep.Ready, "%v", rep.Checks)
	require.True(t, strings.HasPrefix(rep.Checks["retention_horizon"], "warning: claim retention 2h0m0s"), "%v", rep.Checks)
	require.Contains(t, rep.Checks["synchronous_standby"], noSyncStandby, "%v", rep.Checks)
}

// On a cluster of the test's own with a real streaming standby, the
// warning of a running consumer follows the standby: it clears once the
// standby is synchronous (and an ack then means the standby has applied
// the effect: it is there the moment the outcome is reported), comes back
// naming what is missing when the standby dies while still listed
// (commits would wait), and again when synchronous_standby_names is
// emptied, as Patroni does outside strict mode. Not parallel: it shortens
// the package's re-check interval.
func TestSynchronousStandbyWarningFollowsTheCluster(t *testing.T) {
	defer consumer.SetDurabilityIntervalForTest(20 * time.Millisecond)()
	primary := testenv.StartPGCluster(t)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	pool, err := pgxpool.New(ctx, primary.URL("postgres"))
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	exec := func(sql string) {
		t.Helper()
		_, err := pool.Exec(ctx, sql)
		require.NoError(t, err)
	}
	exec("CREATE TABLE effects (event_id text PRIMARY KEY)")

	var logs testenv.Output
	applied := make(chan string, 1)
	cfg := baseConfig("sync", "orders", pool, "claimtx", goChannel("sync-"+randHex()))
	cfg.Claim.SynchronousCommit = "remote_apply"
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	cfg.OnOutcome = func(r middleware.Result) {
		if r.Outcome == framework.Applied {
			applied <- r.Message.Metadata.Get("event_id")
		}
	}
	c, err := consumer.New(ctx, cfg, insertEventID)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	warning := func() string { return c.Health().Check(ctx).Checks["synchronous_standby"] }
	require.Contains(t, warning(), noSyncStandby)
	done := runUntilCancel(ctx, c)

	standby := primary.StartStandby(t)
	exec("ALTER SYSTEM SET synchronous_standby_names = '*'")
	exec("SELECT pg_reload_conf()")
	require.Eventually(t, func() bool { return warning() == "" }, time.Minute, 20*time.Millisecond, "the standby never became synchronous: %s", logs.String())
	require.Contains(t, logs.String(), "a synchronous standby is back")

	pub := newPublisher(t, cfg.Broker)
	require.NoError(t, pub.Publish("orders", testenv.Message(`{}`, "event_id", "e1")))
	select {
	case id := <-applied:
		require.Equal(t, "e1", id)
	case <-time.After(30 * time.Second):
		t.Fatal("the message was not applied")
	}
	spool, err := pgxpool.New(ctx, standby.URL("postgres"))
	require.NoError(t, err)
	t.Cleanup(spool.Close)
	require.Equal(t, 1, queryInt(t, spool, "SELECT count(*) FROM effects WHERE event_id = 'e1'"), "remote_apply: applied on the standby when acked")

	// The standby dies while still listed: commits would wait for it.
	spool.Close()
	require.NoError(t, standby.Stop(ctx))
	require.Eventually(t, func() bool {
		return strings.Contains(warning(), `synchronous_standby_names is "*", but none of the 0 connected standbys is synchronous`)
	}, time.Minute, 20*time.Millisecond, "%s", logs.String())
	// Patroni, outside strict mode, drops it from the list.
	exec("ALTER SYSTEM RESET synchronous_standby_names")
	exec("SELECT pg_reload_conf()")
	require.Eventually(t, func() bool { return strings.Contains(warning(), noSyncStandby) }, time.Minute, 20*time.Millisecond, "%s", logs.String())
	require.Equal(t, 2, strings.Count(logs.String(), noSyncStandby), "logged when it appeared and when it came back, not at every check: %s", logs.String())
	cancel()
	require.NoError(t, <-done)
}
