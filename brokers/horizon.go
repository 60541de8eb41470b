package brokers

import (
	"math"
	"time"
)

// UnboundedHorizon is the replay horizon of a broker that keeps a message
// until it is consumed (a RabbitMQ queue without a TTL, a Kafka topic with
// retention.ms -1 or compacted).
//
// A subscriber tells its replay horizon, how old a message can be when the
// broker still delivers it, by having the method
// ReplayHorizon(ctx context.Context, topic string) (time.Duration, error),
// returning UnboundedHorizon for a broker that keeps messages until they
// are consumed. brokers/amqp, brokers/kafka and brokers/nats do, and so may an adapter
// of yours: framework/consumer compares it with Config.Retention, and
// `claimtx stats` and the console show it.
const UnboundedHorizon = time.Duration(math.MaxInt64)
