package kafka

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/claimtx/claimtx/brokers"
	"github.com/claimtx/claimtx/brokers/internal/warnlog"
	"github.com/claimtx/claimtx/internal/kafkarecord"
)

// attach is kafkarecord.Adapter.Attach (docs/design.md, "Kafka positions").
func attach(sub any, o kafkarecord.Options) bool {
	s, ok := sub.(*subscriber)
	if ok {
		s.mu.Lock()
		s.positions = o
		s.mu.Unlock()
	}
	return ok
}

// adjustTimeout bounds adjustOffsets, which the rebalance waits for: past
// it, partitions start where the group says.
const adjustTimeout = 10 * time.Second

// adjustOffsets is franz-go's AdjustFetchOffsetsFn: a partition whose stored
// position is past the group's offset (committed, or the reset offset)
// starts there, since every record below it was settled, even if retention
// removed its claim. A failed read starts where the group says: the claims
// still decide.
func (g *subscription) adjustOffsets(ctx context.Context, offsets map[string]map[int32]kgo.Offset) (map[string]map[int32]kgo.Offset, error) {
	<-g.clientSet
	o := g.s.positionOptions()
	parts := offsets[g.topic]
	if o.Loader == nil || len(parts) == 0 {
		return offsets, nil
	}
	ctx, cancel := context.WithTimeout(ctx, adjustTimeout)
	defer cancel()
	failed := func(what string, err error) (map[string]map[int32]kgo.Offset, error) {
		g.s.logger.Error("Reading the "+what+" failed; starting where the group's offsets say (the claims still turn redeliveries into duplicates)", err, g.fields)
		return offsets, nil
	}
	ids := slices.Sorted(maps.Keys(parts))
	stored, err := o.Loader.LoadPositions(ctx, g.topic, ids)
	if err != nil {
		return failed("positions stored with the claims", err)
	}
	var moves []int32
	for _, id := range ids {
		pos, ok := stored[id]
		at := parts[id].EpochOffset().Offset // < 0: no commit, a reset offset
		if !ok || at >= pos {
			continue
		}
		if o.Replay {
			g.s.logger.Info("Group offset is below the position stored with the claims; replaying from the group offset as configured",
				g.fields.Add(watermill.LogFields{"kafka_partition": id, "group_offset": at, "stored_position": pos}))
			continue
		}
		moves = append(moves, id)
	}
	if len(moves) == 0 {
		return offsets, nil
	}
	// A position past the end offset belongs to an earlier topic of that
	// name (deleted and created again): starting there would skip records.
	adm := kadm.NewClient(g.cl)
	ends, err := adm.ListEndOffsets(ctx, g.topic)
	if err != nil {
		return failed("partitions' end offsets", err)
	}
	// Without a commit, the reset offset at the start (-2) is the log
	// start: a stored position at or below it skips nothing.
	var starts kadm.ListedOffsets
	if slices.ContainsFunc(moves, func(id int32) bool { return parts[id].EpochOffset().Offset == -2 }) {
		if starts, err = adm.ListStartOffsets(ctx, g.topic); err != nil {
			return failed("partitions' start offsets", err)
		}
	}
	moved := map[int32]kgo.EpochOffset{}
	defer func() {
		if len(moved) > 0 {
			go g.commitStarts(moved)
		}
	}()
	for _, id := range moves {
		pos, at := stored[id], parts[id].EpochOffset().Offset
		fields := g.fields.Add(watermill.LogFields{"kafka_partition": id, "group_offset": at, "stored_position": pos})
		if at < 0 {
			fields["group_offset"] = "none"
		}
		end, ok := ends.Lookup(g.topic, id)
		switch {
		case !ok || end.Err != nil:
			g.s.logger.Info("Partition end offset unknown; starting where the group's offset says (the claims still turn redeliveries into duplicates)", fields)
			continue
		case pos > end.Offset:
			fields["end_offset"] = end.Offset
			warnlog.Log(g.s.logger, "Position stored with the claims is past the partition's end offset (the topic was deleted and created again?): ignoring it, starting where the group's offset says; delete the topic's rows from kafka_positions once the new topic is consumed", fields)
			continue
		}
		if at == -2 {
			start, ok := starts.Lookup(g.topic, id)
			if !ok || start.Err != nil || pos <= start.Offset {
				continue
			}
		}
		warnlog.Log(g.s.logger, "Group offset is below the position stored with the claims: starting at the stored position, skipping records every one of which was already settled (a crash before the offset commit, a group reset or deletion, or a rewind); set the replay option to replay them through the claims", fields)
		if o.Skipped != nil {
			o.Skipped(g.topic, id, max(at, -1), pos)
		}
		parts[id] = kgo.NewOffset().At(pos).WithEpoch(-1)
		moved[id] = kgo.EpochOffset{Epoch: -1, Offset: pos}
	}
	return offsets, nil
}

// commitStarts commits the stored positions adjustOffsets started
// partitions at: until a record past one is acked nothing else would, and
// the group's offset would stay below records the claims settled, its lag
// never zero. Outside the rebalance, which adjustOffsets runs in. Should
// it land after a later commit, it rewinds the group to a stored position
// only: what follows is redelivered and meets its claims.
func (g *subscription) commitStarts(starts map[int32]kgo.EpochOffset) {
	ctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
	defer cancel()
	g.cl.CommitOffsetsSync(ctx, map[string]map[int32]kgo.EpochOffset{g.topic: starts}, func(_ *kgo.Client, _ *kmsg.OffsetCommitRequest, resp *kmsg.OffsetCommitResponse, err error) {
		if resp != nil {
			for _, t := range resp.Topics {
				for _, p := range t.Partitions {
					err = cmp.Or(err, kerr.ErrorForCode(p.ErrorCode))
				}
			}
		}
		if err != nil {
			g.s.logger.Info("Kafka commit of the stored positions failed; the group's offset moves at the next commit", g.fields.Add(watermill.LogFields{"err": err.Error()}))
		}
	})
}

// endOffsets is kafkarecord.EndOffsets: each partition's high watermark,
// for `claimtx stats` and the console.
func (s *subscriber) endOffsets(ctx context.Context, topic string) (map[int32]int64, error) {
	adm, err := s.adminClient()
	if err != nil {
		return nil, err
	}
	defer adm.Close()
	ends, err := adm.ListEndOffsets(ctx, topic)
	if err != nil {
		return nil, fmt.Errorf("brokers/kafka: end offsets of %q: %w", topic, err)
	}
	out := map[int32]int64{}
	var perr error
	for p, o := range ends[topic] {
		if o.Err != nil {
			perr = fmt.Errorf("brokers/kafka: end offset of %q partition %d: %w", topic, p, o.Err)
		} else {
			out[p] = o.Offset
		}
	}
	return out, perr
}

// adminClient is a short-lived client of its own that joins no group, with
// the subscriber's TLS and SASL settings.
func (s *subscriber) adminClient() (*kadm.Client, error) {
	opts, err := securityOpts(s.cfg, []kgo.Opt{kgo.SeedBrokers(s.cfg.Brokers...), kgo.ClientID(s.cfg.ClientID)})
	if err != nil {
		return nil, err
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, clientOptionsError(err)
	}
	return kadm.NewClient(cl), nil
}

// settled passes an advanced settled position to Options.Settled.
func (s *subscriber) settled(topic string, partition int32, below int64) {
	if f := s.positionOptions().Settled; f != nil {
		f(topic, partition, below)
	}
}

func (s *subscriber) positionOptions() kafkarecord.Options {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.positions
}

// SettledBelow implements kafkarecord.Partition.
func (p *partition) SettledBelow(settling []int64) (int64, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stopped || p.last == nil {
		return 0, false
	}
	for e := p.unacked.Front(); e != nil; e = e.Next() {
		off := e.Value.(*kgo.Record).Offset
		if !slices.Contains(settling, off) {
			return off, true
		}
	}
	return p.last.Offset + 1, true
}

// ReplayHorizon reports how old a message of topic can be when Kafka still
// delivers it: the topic's retention.ms, or brokers.UnboundedHorizon when it
// keeps records forever (-1) or is compacted. A topic that does not exist
// yet reports the broker's log.retention.ms. A consumer compares it with
// its claim retention (framework/consumer's Config.Retention).
func (s *subscriber) ReplayHorizon(ctx context.Context, topic string) (time.Duration, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	adm, err := s.adminClient()
	if err != nil {
		return 0, err
	}
	defer adm.Close()
	rc, err := describe(adm.DescribeTopicConfigs(ctx, topic))
	if err == nil {
		return horizonOf(topic, rc.Configs, "")
	}
	// An unknown topic gets the controller's default.
	if md, merr := adm.BrokerMetadata(ctx); merr == nil {
		if rc, berr := describe(adm.DescribeBrokerConfigs(ctx, md.Controller)); berr == nil {
			return horizonOf(topic, rc.Configs, "log.")
		}
	}
	if ctxErr := ctx.Err(); ctxErr != nil {
		return 0, ctxErr
	}
	return 0, fmt.Errorf("brokers/kafka: replay horizon of %q: %w", topic, err)
}

// horizonOf reads retention.ms and cleanup.policy off configs, whose keys
// carry prefix ("log." for the broker's defaults).
func horizonOf(topic string, configs []kadm.Config, prefix string) (time.Duration, error) {
	retention := brokers.UnboundedHorizon // Kafka's default is 7 days, but only a value read counts
	found := false
	for _, c := range configs {
		switch strings.TrimPrefix(c.Key, prefix) {
		case "cleanup.policy":
			if strings.Contains(c.MaybeValue(), "compact") {
				return brokers.UnboundedHorizon, nil
			}
		case "retention.ms":
			ms, err := strconv.ParseInt(c.MaybeValue(), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("brokers/kafka: replay horizon of %q: retention.ms %q: %w", topic, c.MaybeValue(), err)
			}
			found = true
			if ms >= 0 && ms < math.MaxInt64/int64(time.Millisecond) {
				retention = time.Duration(ms) * time.Millisecond
			}
		}
	}
	if !found {
		return 0, fmt.Errorf("brokers/kafka: replay horizon of %q: the broker reported no retention.ms", topic)
	}
	return retention, nil
}

// describe returns the one resource a describe call asked for.
func describe(rcs kadm.ResourceConfigs, err error) (kadm.ResourceConfig, error) {
	switch {
	case err != nil:
		return kadm.ResourceConfig{}, err
	case len(rcs) != 1:
		return kadm.ResourceConfig{}, errors.New("no configuration returned")
	}
	return rcs[0], rcs[0].Err
}
