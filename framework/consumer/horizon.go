package consumer

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/claimtx/claimtx/brokers"
	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/framework/internal/replay"
)

// horizonInterval: topic settings change rarely, and a check is an admin
// request.
const horizonInterval = time.Hour

// horizon compares Config.Retention with the age up to which the broker
// still delivers a message of Topic or PoisonTopic (docs/operations.md).
type horizon struct {
	finding
	p       *parts
	horizon prometheus.Gauge // nil without a Registerer
}

// newHorizon runs the first check; nil without a retention or a
// subscriber that tells its horizon.
func newHorizon(ctx context.Context, p *parts) (*horizon, error) {
	if _, ok, _ := replay.Horizon(context.Background(), p.sub); p.cfg.Retention <= 0 || !ok {
		return nil, nil
	}
	h := &horizon{finding: finding{name: "retention_horizon"}, p: p}
	if reg := p.cfg.Registerer; reg != nil {
		labels := prometheus.Labels{"consumer": p.cfg.Name}
		retained := prometheus.NewGauge(prometheus.GaugeOpts{Name: "claimtx_claim_retention_seconds",
			Help: "How long this consumer's claims are kept (Config.Retention).", ConstLabels: labels})
		h.horizon = prometheus.NewGauge(prometheus.GaugeOpts{Name: "claimtx_replay_horizon_seconds",
			Help: "How old a message of the consumer's topic or poison topic can be when the broker still delivers it (+Inf: unbounded).", ConstLabels: labels})
		for _, g := range []prometheus.Gauge{retained, h.horizon} {
			if err := reg.Register(g); err != nil {
				return nil, fmt.Errorf("claimtx: register retention horizon metrics: %w", err)
			}
		}
		retained.Set(p.cfg.Retention.Seconds())
	}
	return h, h.check(ctx, p.cfg.StrictRetentionHorizon)
}

// check runs one comparison; with strict a horizon beyond the retention is
// a ConfigError.
func (h *horizon) check(ctx context.Context, strict bool) error {
	cfg := h.p.cfg
	longest, _, err := replay.Horizon(ctx, h.p.sub, cfg.Topic, cfg.PoisonTopic)
	if err != nil {
		// Not knowing is not a finding: log it and keep the last one.
		cfg.Logger.Warn("claimtx: cannot read the broker's replay horizon", "consumer", cfg.Name, "error", err.Error())
		return nil
	}
	if h.horizon != nil {
		if longest == brokers.UnboundedHorizon {
			h.horizon.Set(math.Inf(1))
		} else {
			h.horizon.Set(longest.Seconds())
		}
	}
	if longest <= cfg.Retention {
		h.set("")
		return nil
	}
	shown := replay.Format(longest)
	// Retention comes with the expiry guard: dead-lettered, not applied twice.
	msg := fmt.Sprintf("claim retention %s is shorter than the broker's replay horizon %s for %s and %s: a message older than the retention is poisoned as expired instead of applied",
		cfg.Retention, shown, cfg.Topic, cfg.PoisonTopic)
	h.set(msg)
	cfg.Logger.Warn("claimtx: "+msg, "consumer", cfg.Name, "retention", cfg.Retention.String(), "replay_horizon", shown)
	if strict {
		return &framework.ConfigError{Field: "Retention", Reason: msg + " (StrictRetentionHorizon)"}
	}
	return nil
}

func (h *horizon) watch(ctx context.Context) {
	every(ctx, horizonInterval, func() { _ = h.check(ctx, false) })
}
