package kafkarecord

import (
	"cmp"
	"slices"
)

// Settled is one partition's settled position.
type Settled struct {
	Topic        string
	Partition    int32
	SettledBelow int64
}

// Settling collects the records a claim transaction settles, by
// partition, and computes the positions to store with it.
type Settling struct {
	parts []settlingPart
}

type settlingPart struct {
	of      Partition
	topic   string
	id      int32
	offsets []int64
}

// Add records that r is settled once the transaction commits.
func (s *Settling) Add(r Record) {
	if r.Of == nil {
		return
	}
	if i := slices.IndexFunc(s.parts, func(p settlingPart) bool { return p.of == r.Of }); i >= 0 {
		s.parts[i].offsets = append(s.parts[i].offsets, r.Offset)
		return
	}
	s.parts = append(s.parts, settlingPart{of: r.Of, topic: r.Topic, id: r.Partition, offsets: []int64{r.Offset}})
}

// Positions returns the positions to store, in (topic, partition) order,
// without the partitions this member no longer holds.
func (s *Settling) Positions() []Settled {
	var out []Settled
	for _, p := range s.parts {
		off, ok := p.of.SettledBelow(p.offsets)
		if !ok {
			continue
		}
		// Revoked and assigned again during the batch: keep the higher.
		if j := slices.IndexFunc(out, func(q Settled) bool { return q.Topic == p.topic && q.Partition == p.id }); j >= 0 {
			out[j].SettledBelow = max(out[j].SettledBelow, off)
			continue
		}
		out = append(out, Settled{Topic: p.topic, Partition: p.id, SettledBelow: off})
	}
	slices.SortFunc(out, func(a, b Settled) int {
		return cmp.Or(cmp.Compare(a.Topic, b.Topic), cmp.Compare(a.Partition, b.Partition))
	})
	return out
}
