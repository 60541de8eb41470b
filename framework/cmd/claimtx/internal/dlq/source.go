package dlq

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/claimtx/claimtx/brokers"
	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/internal/config"
)

// Source is a poison destination opened for browsing and replay. It is
// not safe for concurrent use.
type Source interface {
	// Destination names the queue or topic.
	Destination() string
	// Total is how many messages the browse will read at most: those
	// present when it was opened (on Kafka, from the start offsets on).
	Total() int64
	// Next returns up to max further letters in destination order, and
	// io.EOF once every message present at the opening has been read.
	Next(ctx context.Context, max int) ([]*Letter, error)
	// Settle republishes every letter of batch (letters Next returned, in
	// order) whose Action is ActionReplay to target(letter), waits until
	// the broker confirmed them, marks them Replayed and removes them from
	// the destination (RabbitMQ, NATS) or records the progress (Kafka,
	// kafkaSource). It returns the first error; letters whose
	// copy was not confirmed stay in the destination.
	Settle(ctx context.Context, batch []*Letter, target func(*Letter) string) error
	// Close ends the browse: on RabbitMQ every message not removed goes
	// back to the queue.
	Close() error
}

// Options says what to open.
type Options struct {
	// Destination is the poison queue or topic. Required.
	Destination string
	// Consumer names the consumer whose replay progress (Kafka: the
	// consumer group "claimtx-dlq-<Consumer>") is read, and written by
	// Settle. Empty: no progress is read, and Settle records none.
	Consumer string
	// Resume starts a Kafka browse at the consumer's recorded replay
	// progress instead of the earliest retained offset (what a replay and
	// its dry run do). Ignored on RabbitMQ and NATS, where a replayed
	// message is gone.
	Resume bool
}

// page is what Next returns for the letters out it read: io.EOF when
// there were none.
func page(out []*Letter) ([]*Letter, error) {
	if len(out) == 0 {
		return nil, io.EOF
	}
	return out, nil
}

// eachReplay calls send with every letter of batch to replay and its
// target, in order, and stops at the first error, which it returns: the
// letters after it stay for a later run.
func eachReplay(batch []*Letter, target func(*Letter) string, send func(l *Letter, target string) error) error {
	for _, l := range batch {
		if l.Action != ActionReplay {
			continue
		}
		if err := send(l, target(l)); err != nil {
			return err
		}
	}
	return nil
}

// ProgressGroup is the Kafka consumer group under which the replays of
// consumer record their progress.
func ProgressGroup(consumer string) string { return "claimtx-dlq-" + consumer }

// Open opens the poison destination of cfg's broker for browsing and
// replay. Only RabbitMQ ("amqp"), Kafka and NATS are supported: a
// gochannel or registered kind is a *framework.ConfigError naming "kind"
// (BROKER when the environment set it, as brokers names its errors).
func Open(ctx context.Context, cfg brokers.Config, o Options) (Source, error) {
	if o.Destination == "" {
		return nil, errors.New("dlq: no destination")
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	switch kind := cfg.Kind; kind {
	case brokers.KindAMQP, "":
		return openAMQP(ctx, cfg.AMQP, o)
	case brokers.KindKafka:
		return openKafka(ctx, cfg.Kafka, o)
	case brokers.KindNATS:
		return openNATS(ctx, cfg.NATS, o)
	default:
		return nil, config.Named(cfg, &framework.ConfigError{Field: "kind", Reason: fmt.Sprintf("%q: dead letters can be browsed on %s, %s and %s only",
			kind, brokers.KindAMQP, brokers.KindKafka, brokers.KindNATS)})
	}
}
