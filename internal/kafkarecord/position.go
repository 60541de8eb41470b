// Package kafkarecord is what the Kafka adapter tells the rest of claimtx
// about a record it delivers: the metadata keys it sets (meta.go) and the
// record's place in its partition, carried from
// the subscriber (brokers/kafka) to the claim transaction (middleware),
// which stores the partition's settled position with the claim, and back:
// on assignment the subscriber starts a partition from the stored position
// when it is past the group's committed offset.
//
// A partition's settled position is the offset below which every record
// is settled (applied, duplicate or poisoned: acked). With several records
// of a partition in flight it is not the offset of the last one settled:
// it is the lowest offset still in flight.
package kafkarecord

import "context"

// Partition is the subscriber's view of one assigned partition.
type Partition interface {
	// SettledBelow returns the offset below which every record of the
	// partition is settled once the records at the offsets in settling
	// (the caller's transaction) commit: the lowest offset handed out
	// and not acked outside settling, or one past the latest handed out.
	// ok is false once the partition is no longer this member's: its
	// state then says nothing.
	SettledBelow(settling []int64) (offset int64, ok bool)
}

// Record is one delivered record's place.
type Record struct {
	Topic     string
	Partition int32
	Offset    int64
	Of        Partition
	// Window is how many records of the partition the subscriber hands
	// out before one is acked (at least 1). With 1, no other record of
	// the partition is in flight on this member while this one is: the
	// claim stores its position in its first round trip.
	Window int
}

type ctxKey struct{}

// NewContext returns ctx carrying r.
func NewContext(ctx context.Context, r Record) context.Context {
	return context.WithValue(ctx, ctxKey{}, r)
}

// FromContext returns the record ctx carries, if any.
func FromContext(ctx context.Context) (Record, bool) {
	r, ok := ctx.Value(ctxKey{}).(Record)
	return r, ok
}

// Loader reads stored positions: for each of the topic's partitions that
// has one, the offset below which every record was settled.
type Loader interface {
	LoadPositions(ctx context.Context, topic string, partitions []int32) (map[int32]int64, error)
}

// Options is how a subscriber uses stored positions.
type Options struct {
	Loader Loader
	// Replay makes the subscriber start where the group's offset says
	// even when the stored position is past it (an operator replaying on
	// purpose); the claims then decide what is a duplicate.
	Replay bool
	// Skipped is told when a partition starts at its stored position
	// because the group's offset (-1: the group had none) was below it.
	Skipped func(topic string, partition int32, groupOffset, stored int64)
	// Settled, when set, is told each time acks advance a partition's
	// settled position: every record below below is acked. It runs on
	// the subscriber's ack path: keep it fast, never block. A consumer
	// stores these outside the claim transactions now and then, so that
	// the stored position catches up with records settled after the last
	// transaction of their partition computed its position (several in
	// flight: a window, batches).
	Settled func(topic string, partition int32, below int64)
}

// Adapter is what brokers/kafka registers from its init, when it is
// linked: for one of its subscribers (sub, false for any other), how to
// give it Options and how to ask its broker for end offsets.
type Adapter struct {
	Attach     func(sub any, o Options) bool
	EndOffsets func(sub any) (EndOffsetsFunc, bool)
}

// adapter is set once, from an init function, so it is read only after
// it is written (package initialisation happens before main and tests).
var adapter Adapter

// Register is called once, by brokers/kafka's init.
func Register(a Adapter) { adapter = a }

// Attach gives sub the Options, and reports whether sub uses stored
// positions (a Kafka subscriber does; other brokers' do not).
func Attach(sub any, o Options) bool {
	return adapter.Attach != nil && adapter.Attach(sub, o)
}
