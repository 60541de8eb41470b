package standby_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/internal/testenv"
	"github.com/claimtx/claimtx/store/internal/standby"
)

// The decision table: which server states keep the promise of which
// synchronous_commit, and what the warning says is missing.
func TestShortfall(t *testing.T) {
	t.Parallel()
	const (
		noStandby = "synchronous_standby_names is empty: commits are acknowledged without a synchronous standby: a failover can lose acknowledged effects"
		waits     = "commits wait until one is"
	)
	for _, tc := range []struct {
		name     string
		setting  string
		state    standby.State
		want     string // a substring of the shortfall; "" for none
		verified bool
	}{
		{"server default", "", standby.State{}, "", true},
		{"on", "on", standby.State{}, "", true},
		{"local", "local", standby.State{}, "", true},
		{"remote_apply without names", "remote_apply", standby.State{}, noStandby, true},
		{"remote_write without names", "remote_write", standby.State{}, noStandby, true},
		{"blank names", "remote_apply", standby.State{Names: "  ", Standbys: 1, Sync: 1}, noStandby, true},
		{"names, an async standby only", "remote_apply", standby.State{Names: "s1", Standbys: 1}, waits, true},
		{"names, no standby connected", "remote_write", standby.State{Names: "*"}, `synchronous_standby_names is "*", but none of the 0 connected`, true},
		{"names and a sync standby", "remote_apply", standby.State{Names: "FIRST 1 (s1, s2)", Standbys: 2, Sync: 1}, "", true},
		{"names and quorum standbys", "remote_write", standby.State{Names: "ANY 1 (s1, s2)", Standbys: 2, Sync: 2}, "", true},
		{"names, sync_state unreadable", "remote_apply", standby.State{Names: "s1", Standbys: 1, Hidden: 1}, "", false},
		{"no names, sync_state unreadable", "remote_apply", standby.State{Standbys: 1, Hidden: 1}, noStandby, true},
		{"on does not need the standby", "on", standby.State{Names: "s1"}, "", true},
	} {
		got, verified := tc.state.Shortfall(tc.setting)
		if tc.want == "" {
			require.Empty(t, got, tc.name)
		} else {
			require.Contains(t, got, tc.want, tc.name)
			require.Contains(t, got, "synchronous_commit "+tc.setting, tc.name)
		}
		require.Equal(t, tc.verified, verified, tc.name)
	}
}

// The machine's server replicates to nobody: Read says so.
func TestReadWithoutStandby(t *testing.T) {
	t.Parallel()
	pool, _ := testenv.Setup(t, 1)
	st, err := standby.Read(t.Context(), pool)
	require.NoError(t, err)
	require.Equal(t, standby.State{}, st)
	got, verified := st.Shortfall("remote_apply")
	require.Contains(t, got, "synchronous_standby_names is empty")
	require.True(t, verified)
}
