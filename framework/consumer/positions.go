package consumer

import (
	"cmp"
	"context"
	"slices"
	"sync"
	"time"

	"github.com/claimtx/claimtx/internal/kafkarecord"
	"github.com/claimtx/claimtx/internal/pg"
)

const (
	positionsEvery = time.Second     // how often settled positions are stored
	gaugesEvery    = 15              // of those, how often claimtx_kafka_position is read
	flushTimeout   = 2 * time.Second // the last store, at Close
)

// settledPositions collects the positions acks settled: a claim
// transaction stores the one it knew, which with several in flight lags;
// everything below these is acked, so storing them is safe at any time.
type settledPositions struct {
	mu      sync.Mutex
	pending map[kafkarecord.Settled]int64 // by topic and partition
}

func (s *settledPositions) add(topic string, partition int32, below int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := kafkarecord.Settled{Topic: topic, Partition: partition}
	if below > s.pending[k] {
		s.pending[k] = below
	}
}

// take returns the pending positions, sorted, and forgets them.
func (s *settledPositions) take() []kafkarecord.Settled {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]kafkarecord.Settled, 0, len(s.pending))
	for k, off := range s.pending {
		k.SettledBelow = off
		out = append(out, k)
	}
	clear(s.pending)
	slices.SortFunc(out, func(a, b kafkarecord.Settled) int {
		return cmp.Or(cmp.Compare(a.Topic, b.Topic), cmp.Compare(a.Partition, b.Partition))
	})
	return out
}

// flushPositions stores the settled positions, keeping them on failure.
func (p *parts) flushPositions(ctx context.Context) {
	if !p.positions {
		return
	}
	ps := p.settled.take()
	if len(ps) == 0 {
		return
	}
	if err := pg.ClaimsOf(p.store).Positions().Store(ctx, p.pool, p.cfg.Name, ps); err != nil {
		for _, pos := range ps {
			p.settled.add(pos.Topic, pos.Partition, pos.SettledBelow)
		}
		p.cfg.Logger.Debug("claimtx: storing settled Kafka positions failed; retrying", "consumer", p.cfg.Name, "err", err)
	}
}

// attachPositions gives a Kafka subscriber the stored positions and
// reports whether it uses them; a role that cannot write them is refused.
func (p *parts) attachPositions(ctx context.Context) (bool, error) {
	cfg := p.cfg
	if cfg.Claim.NoPositions {
		return false, nil
	}
	p.settled = &settledPositions{pending: map[kafkarecord.Settled]int64{}}
	attached := kafkarecord.Attach(p.sub, kafkarecord.Options{
		Loader:  pg.ClaimsOf(p.store).Positions().Loader(cfg.Name),
		Settled: p.settled.add,
		Replay:  cfg.Claim.ReplayBelowPositions,
		// The subscriber has logged the WARN line with the offsets.
		Skipped: func(topic string, partition int32, _, stored int64) {
			if p.metrics != nil {
				p.metrics.OnPositionSkipped(cfg.Name, topic, partition)
				p.metrics.SetPosition(cfg.Name, topic, partition, stored)
			}
		},
	})
	if !attached {
		return false, nil
	}
	err := p.requireClaimPrivileges(ctx, "Claim.NoPositions", "kafka_positions",
		"every claim transaction of a Kafka consumer writes", "positions")
	return err == nil, err
}

// watchPositions stores and exports positions until ctx ends.
func (p *parts) watchPositions(ctx context.Context) {
	if !p.positions {
		return
	}
	positions, tick := pg.ClaimsOf(p.store).Positions(), 0
	update := func() {
		p.flushPositions(ctx)
		if p.metrics != nil && tick%gaugesEvery == 0 {
			if ps, err := positions.Of(ctx, p.cfg.Name); err == nil {
				for _, pos := range ps {
					p.metrics.SetPosition(p.cfg.Name, pos.Topic, pos.Partition, pos.SettledBelow)
				}
			}
		}
		tick++
	}
	update()
	every(ctx, positionsEvery, update)
}
