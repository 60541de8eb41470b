// Package kafkarecord is what the Kafka adapter tells the rest of claimtx
// about a record it delivers: the metadata keys it sets and the record's
// place in its partition, from which the claim transaction stores the
// partition's settled position (docs/design.md, "Kafka positions"): the
// offset below which every record is settled, with several in flight the
// lowest one still in flight.
package kafkarecord

import "context"

// Partition is the subscriber's view of one assigned partition.
type Partition interface {
	// SettledBelow returns the partition's settled position once the
	// records at the offsets in settling (the caller's transaction)
	// commit; ok is false once the partition is no longer this member's.
	SettledBelow(settling []int64) (offset int64, ok bool)
}

// Record is one delivered record's place.
type Record struct {
	Topic     string
	Partition int32
	Offset    int64
	Of        Partition
	// Window is how many records of the partition may be in flight (at
	// least 1). With 1 the claim stores the position in its first round
	// trip.
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
	// Replay starts where the group's offset says even below the stored
	// position (a replay on purpose); the claims decide.
	Replay bool
	// Skipped is told when a partition starts at its stored position
	// because the group's offset (-1: the group had none) was below it.
	Skipped func(topic string, partition int32, groupOffset, stored int64)
	// Settled, when set, is told each time acks advance a partition's
	// settled position, on the ack path: never block. A consumer stores
	// these now and then, for records settled after their partition's
	// last claim transaction computed its position.
	Settled func(topic string, partition int32, below int64)
}

// Adapter is what brokers/kafka registers when linked; its functions
// return false for another broker's subscriber.
type Adapter struct {
	Attach     func(sub any, o Options) bool
	EndOffsets func(sub any) (EndOffsetsFunc, bool)
}

// adapter is set once, from an init function, before any read.
var adapter Adapter

// Register is called once, by brokers/kafka's init.
func Register(a Adapter) { adapter = a }

// Attach gives sub the Options, and reports whether sub uses stored
// positions (only a Kafka subscriber does).
func Attach(sub any, o Options) bool {
	return adapter.Attach != nil && adapter.Attach(sub, o)
}

// EndOffsetsFunc returns the end offset (one past the latest record) of
// each partition of topic.
type EndOffsetsFunc func(ctx context.Context, topic string) (map[int32]int64, error)

// EndOffsets returns how to ask the broker of sub for its end offsets, or
// false; plumbing for `claimtx stats` and the console, kept out of the
// adapter's API.
func EndOffsets(sub any) (EndOffsetsFunc, bool) {
	if adapter.EndOffsets == nil {
		return nil, false
	}
	return adapter.EndOffsets(sub)
}
