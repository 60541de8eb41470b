package consumer

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/claimtx/claimtx/internal/pg"
)

// durabilityInterval is how often the synchronous standby is checked again:
// Patroni, outside synchronous_mode_strict, drops a failed standby and adds
// it back. A variable for the tests.
var durabilityInterval = 30 * time.Second

// durability watches whether commits with Claim.SynchronousCommit
// remote_write or remote_apply have the synchronous standby they wait for
// (without one a failover can lose an acked effect): a readiness warning,
// never a failed start-up, as the standby may come back.
type durability struct {
	finding
	p        *parts
	setting  string
	interval time.Duration // durabilityInterval when the consumer was built
}

// newDurability runs the first check; nil when the setting needs no standby.
func newDurability(ctx context.Context, p *parts) *durability {
	setting := p.cfg.Claim.SynchronousCommit
	if !pg.NeedsSyncStandby(setting) {
		return nil
	}
	d := &durability{finding: finding{name: "synchronous_standby"}, p: p, setting: setting, interval: durabilityInterval}
	d.check(ctx, true)
	return d
}

// check runs one check; the first also says when it could not verify.
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
	prev := d.get()
	switch {
	case shortfall == "":
		d.set("")
		if prev != "" {
			cfg.Logger.Info("claimtx: a synchronous standby is back: commits wait for it again", "consumer", cfg.Name, "synchronous_commit", d.setting)
		}
		if first && !verified {
			cfg.Logger.Warn("claimtx: cannot tell whether a standby is synchronous: the database role cannot read pg_stat_replication's sync_state (grant it pg_monitor); "+
				"only synchronous_standby_names was checked, and it names standbys", "consumer", cfg.Name, "synchronous_commit", d.setting)
		}
	case shortfall != prev:
		d.set(shortfall)
		cfg.Logger.Warn("claimtx: "+shortfall, "consumer", cfg.Name, "synchronous_commit", d.setting)
	}
}

func (d *durability) watch(ctx context.Context) {
	every(ctx, d.interval, func() { d.check(ctx, false) })
}

// finding is a readiness warning under name that comes and goes.
type finding struct {
	name string
	v    atomic.Pointer[string]
}

func (f *finding) set(w string) { f.v.Store(&w) }

func (f *finding) get() string {
	if w := f.v.Load(); w != nil {
		return *w
	}
	return ""
}

func (f *finding) warnings() map[string]string {
	if w := f.get(); w != "" {
		return map[string]string{f.name: w}
	}
	return nil
}

// every calls f every interval until ctx ends.
func every(ctx context.Context, interval time.Duration, f func()) {
	pg.Every(ctx, interval, func() bool { f(); return true })
}
