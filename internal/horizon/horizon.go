// Package horizon compares claim retention with a broker's replay
// horizon: how old a message can be when the broker still delivers it.
// framework/consumer checks it at start-up and hourly; `claimtx stats`
// prints it.
package horizon

import (
	"context"
	"math"
	"time"
)

// Unbounded is the horizon of a broker that keeps a message until it is
// consumed (a RabbitMQ queue without a TTL, a Kafka topic with retention.ms
// -1 or compacted).
const Unbounded = time.Duration(math.MaxInt64)

// reporter is implemented by subscribers that know their horizon
// (brokers/kafka, brokers/amqp; an adapter of a user's may).
type reporter interface {
	ReplayHorizon(ctx context.Context, topic string) (time.Duration, error)
}

// Of returns the longest replay horizon of topics on sub; ok is false when
// sub cannot tell.
func Of(ctx context.Context, sub any, topics ...string) (longest time.Duration, ok bool, err error) {
	r, ok := sub.(reporter)
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

// String prints a horizon: "unbounded" or the duration.
func String(d time.Duration) string {
	if d == Unbounded {
		return "unbounded"
	}
	return d.String()
}
