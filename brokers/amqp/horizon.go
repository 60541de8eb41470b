package amqp

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/claimtx/claimtx/brokers"
)

// ReplayHorizon reports how old a message of topic can be when RabbitMQ
// still delivers it: QueueArguments' x-message-ttl, else
// brokers.UnboundedHorizon (a TTL set by a server policy is not visible
// over AMQP). A consumer compares it with its claim retention.
func (s *Subscriber) ReplayHorizon(ctx context.Context, topic string) (time.Duration, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	v, ok := s.cfg.QueueArguments["x-message-ttl"]
	if !ok {
		return brokers.UnboundedHorizon, nil
	}
	var ms int64
	switch n := v.(type) {
	case int:
		ms = int64(n)
	case int32:
		ms = int64(n)
	case int64:
		ms = n
	case float64:
		ms = int64(n)
	default:
		return 0, fmt.Errorf("brokers/amqp: replay horizon of %q: x-message-ttl %v (%T) is not a number", topic, v, v)
	}
	if ms < 0 || ms >= math.MaxInt64/int64(time.Millisecond) {
		return brokers.UnboundedHorizon, nil
	}
	return time.Duration(ms) * time.Millisecond, nil
}
