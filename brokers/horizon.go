package brokers

import (
	"math"
	"time"
)

// UnboundedHorizon is the replay horizon of a broker that keeps a message
// until it is consumed (a RabbitMQ queue without a TTL, a Kafka topic with
// retention.ms -1 or compacted). A subscriber tells how old a message can
// be when its broker still delivers it with a method
// ReplayHorizon(ctx context.Context, topic string) (time.Duration, error),
// as brokers/amqp, brokers/kafka and brokers/nats do: framework/consumer
// compares it with Config.Retention, and `claimtx stats` and the console
// show it.
const UnboundedHorizon = time.Duration(math.MaxInt64)
