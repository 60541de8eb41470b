package main

import (
	"context"
	"fmt"
	"time"

	"github.com/claimtx/claimtx/brokers"
	"github.com/claimtx/claimtx/framework/cmd/claimtx/internal/opfmt"
	"github.com/claimtx/claimtx/framework/internal/replay"
)

// horizonReport compares a consumer's claim retention with how old a
// message of its topic or poison topic can be when the broker still
// delivers it: what a running consumer logs and exports (framework/consumer,
// Config.Retention), for an operator at the command line.
type horizonReport struct {
	Topic         string        `json:"topic"`
	PoisonTopic   string        `json:"poison_topic"`
	Retention     time.Duration `json:"retention_ns"`
	ReplayHorizon time.Duration `json:"replay_horizon_ns"` // math.MaxInt64: unbounded
	Unbounded     bool          `json:"replay_horizon_unbounded"`
	Exceeded      bool          `json:"horizon_exceeds_retention"`
}

// replayHorizon asks the broker of cfg for the horizon of topic and its
// poison topic.
func replayHorizon(ctx context.Context, cfg brokers.Config, topic, poison string, retention time.Duration) (horizonReport, error) {
	if cfg.Kafka.ConsumerGroup == "" {
		cfg.Kafka.ConsumerGroup = "claimtx-stats" // a subscriber needs one; it never joins
	}
	sub, err := brokers.NewSubscriber(cfg, nil)
	if err != nil {
		return horizonReport{}, err
	}
	defer func() { _ = sub.Close() }()
	longest, ok, err := replay.Horizon(ctx, sub, topic, poison)
	if err != nil {
		return horizonReport{}, err
	}
	if !ok {
		return horizonReport{}, fmt.Errorf("broker %q cannot tell its replay horizon", cfg.Kind)
	}
	rep := horizonReport{Topic: topic, PoisonTopic: poison, Retention: retention, ReplayHorizon: longest}
	rep.Unbounded = longest == brokers.UnboundedHorizon
	rep.Exceeded = rep.ReplayHorizon > retention
	return rep, nil
}

func (r horizonReport) String() string {
	h := replay.Format(r.ReplayHorizon)
	if !r.Unbounded {
		h = opfmt.FormatDuration(r.ReplayHorizon) // "1d", as the flags take it
	}
	verdict := "OK: claims outlive every delivery the broker can still make"
	if r.Exceeded {
		verdict = "WARNING: a message older than the retention may have lost its claim; the expiry guard poisons it as expired instead of applying it (docs/operations.md, Checking the window against the broker)"
	}
	return fmt.Sprintf("retention %s, replay horizon %s (%s, %s): %s", opfmt.FormatDuration(r.Retention), h, r.Topic, r.PoisonTopic, verdict)
}
