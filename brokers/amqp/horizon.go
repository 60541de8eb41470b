package amqp

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/claimtx/claimtx/brokers"
)

// ReplayHorizon reports how old a message of topic can be when RabbitMQ
// still delivers it: the x-message-ttl of brokers.AMQPConfig.QueueArguments when set,
// otherwise brokers.UnboundedHorizon: a RabbitMQ queue keeps a message
// until it is acked, however old. A TTL set by a server-side policy is not
// visible over AMQP and is not seen here. A consumer compares the horizon
// with its claim retention (framework/consumer's Config.Retention).
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
