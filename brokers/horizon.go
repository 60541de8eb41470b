package brokers

import (
	"context"
	"math"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
)

// UnboundedHorizon is the replay horizon of a broker that keeps a message
// until it is consumed (a RabbitMQ queue without a TTL, a Kafka topic with
// retention.ms -1 or compacted).
const UnboundedHorizon = time.Duration(math.MaxInt64)

// horizonReporter is what a subscriber implements to tell its replay
// horizon; brokers/amqp and brokers/kafka do, and so may an adapter of
// yours.
type horizonReporter interface {
	ReplayHorizon(ctx context.Context, topic string) (time.Duration, error)
}

// ReplayHorizon returns the longest replay horizon of topics on sub: how
// old a message can be when the broker still delivers it, which a consumer
// compares with how long it keeps claims (framework/consumer's
// Config.Retention; `claimtx stats` and the console show it too). ok is
// false when sub cannot tell: a subscriber tells by having the method
// ReplayHorizon(ctx context.Context, topic string) (time.Duration, error),
// returning UnboundedHorizon for a broker that keeps messages until they
// are consumed.
func ReplayHorizon(ctx context.Context, sub message.Subscriber, topics ...string) (longest time.Duration, ok bool, err error) {
	r, ok := sub.(horizonReporter)
	if !ok {
		return 0, false, nil
	}
	for _, t := range topics {
		d, err := r.ReplayHorizon(ctx, t)
		if err != nil {
			return 0, true, err
		}
		longest = max(longest, d)
	}
	return longest, true, nil
}

// FormatHorizon prints a replay horizon: "unbounded" or the duration.
func FormatHorizon(d time.Duration) string {
	if d == UnboundedHorizon {
		return "unbounded"
	}
	return d.String()
}
