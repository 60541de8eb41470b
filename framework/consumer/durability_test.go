package consumer_test

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/brokers"
	"github.com/claimtx/claimtx/framework/consumer"
	"github.com/claimtx/claimtx/internal/testenv"
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
