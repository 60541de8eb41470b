package kafkarecord

import "context"

// EndOffsetsFunc returns the end offset (one past the latest record) of
// each partition of topic.
type EndOffsetsFunc func(ctx context.Context, topic string) (map[int32]int64, error)

// endOffsetsOf is set by brokers/kafka when it is linked. It is plumbing
// for `claimtx stats` and the console, so it is not a method in the
// adapter's API.
var endOffsetsOf func(sub any) (EndOffsetsFunc, bool)

// RegisterEndOffsets is called once, from brokers/kafka's init.
func RegisterEndOffsets(f func(sub any) (EndOffsetsFunc, bool)) { endOffsetsOf = f }

// EndOffsets returns how to ask the broker of sub for its end offsets, or
// false when sub (or no linked adapter) can tell them.
func EndOffsets(sub any) (EndOffsetsFunc, bool) {
	if endOffsetsOf == nil {
		return nil, false
	}
	return endOffsetsOf(sub)
}
