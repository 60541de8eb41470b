package consumer

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/claimtx/claimtx/internal/pg"
)

// durabilityInterval is how often a running consumer checks again that the
// server has the synchronous standby its Claim.SynchronousCommit relies
// on: Patroni, outside synchronous_mode_strict, drops a failed standby
// from synchronous_standby_names and adds it back when it returns, so the
// finding comes and goes while the consumer runs. Each check is one small
// query. A variable so that the tests of this package can shorten it.
var durabilityInterval = 30 * time.Second

// durabilityCheck is the readiness report's name for the finding.
const durabilityCheck = "synchronous_standby"

// durability watches whether commits with Claim.SynchronousCommit
// remote_write or remote_apply get the synchronous standby they wait for.
// Without one the server acknowledges a commit, and the consumer acks its
// message, once the primary alone has it, and a failover can lose the
// effect: the finding is logged at WARN when it appears or changes (at
// INFO when it clears) and shown as a warning in the readiness report.
// It never fails start-up: the standby may come back.
type durability struct {
	p        *parts
	setting  string
	interval time.Duration          // durabilityInterval when the consumer was built
	warning  atomic.Pointer[string] // the current finding; nil when none
}

// newDurability runs the first check; nil when the setting needs no
// standby (unset, on, local).
func newDurability(ctx context.Context, p *parts) *durability {
	setting := p.cfg.Claim.SynchronousCommit
	if !pg.NeedsSyncStandby(setting) {
		return nil
	}
	d := &durability{p: p, setting: setting, interval: durabilityInterval}
	d.check(ctx, true)
	return d
}

// check runs one check; first says it is the start-up one, which also
// says when the standby could not be verified.
func (d *durability) check(ctx context.Context, first bool) {
	cfg := d.p.cfg
	shortfall, verified, err := pg.ClaimsOf(d.p.store).SyncStandby(ctx, d.setting)
	if err != nil {
		if ctx.Err() != nil {
			return // shutting down
		}
		// Not knowing is not a finding: log it and keep the last one.
		cfg.Logger.Warn("claimtx: cannot check for a synchronous standby", "consumer", cfg.Name, "synchronous_commit", d.setting, "error", err.Error())
		return
	}
	var prev string
	if w := d.warning.Load(); w != nil {
		prev = *w
	}
	switch {
	case shortfall == "":
		d.warning.Store(nil)
		if prev != "" {
			cfg.Logger.Info("claimtx: a synchronous standby is back: commits wait for it again", "consumer", cfg.Name, "synchronous_commit", d.setting)
		}
		if first && !verified {
			cfg.Logger.Warn("claimtx: cannot tell whether a standby is synchronous: the database role cannot read pg_stat_replication's sync_state (grant it pg_monitor); "+
				"only synchronous_standby_names was checked, and it names standbys", "consumer", cfg.Name, "synchronous_commit", d.setting)
		}
	case shortfall != prev:
		d.warning.Store(&shortfall)
		cfg.Logger.Warn("claimtx: "+shortfall, "consumer", cfg.Name, "synchronous_commit", d.setting)
	}
}

// warnings is the readiness report's view of the last finding.
func (d *durability) warnings() map[string]string {
	if w := d.warning.Load(); w != nil {
		return map[string]string{durabilityCheck: *w}
	}
	return nil
}

// watch repeats the check every d.interval until ctx ends.
func (d *durability) watch(ctx context.Context) {
	t := time.NewTicker(d.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			d.check(ctx, false)
		}
	}
}
