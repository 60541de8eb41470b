package kafkarecord

import "context"

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
