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

// Source is a poison destination opened for browsing and replay; not safe
// for concurrent use.
type Source interface {
	Destination() string // the queue or topic
	// Total is how many messages the browse reads at most: those present
	// at the opening (on Kafka, from the start offsets on).
	Total() int64
	// Next returns up to max further letters in destination order; io.EOF
	// once every message present at the opening was read.
	Next(ctx context.Context, max int) ([]*Letter, error)
	// Settle republishes the letters of batch whose Action is ActionReplay
	// to target(letter) and, once the broker confirmed a copy, marks it
	// Replayed and removes it (RabbitMQ, NATS) or records the progress
	// (Kafka). Unconfirmed letters stay in the destination.
	Settle(ctx context.Context, batch []*Letter, target func(*Letter) string) error
	// Close ends the browse: on RabbitMQ every message not removed goes
	// back to the queue.
	Close() error
}

// Options says what to open.
type Options struct {
	Destination string // the poison queue or topic; required
	// Consumer's replay progress (Kafka: group ProgressGroup(Consumer)) is
	// read, and written by Settle; empty: none.
	Consumer string
	// Resume starts a Kafka browse at the consumer's replay progress, not
	// the earliest offset. RabbitMQ and NATS remove what was replayed.
	Resume bool
}

// page is what Next returns for out: io.EOF when empty.
func page(out []*Letter) ([]*Letter, error) {
	if len(out) == 0 {
		return nil, io.EOF
	}
	return out, nil
}

// eachReplay calls send with every letter of batch to replay, in order,
// and stops at the first error: the letters after it stay for a later run.
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

// republish is the Settle of a broker that confirms each copy (RabbitMQ,
// NATS): send publishes l to target and returns the wait for its
// confirmation; only a confirmed letter is marked Replayed and removed.
func republish(batch []*Letter, target func(*Letter) string, send func(l *Letter, target string) (wait func() error, err error), remove func(*Letter) error) error {
	var sent []*Letter
	var waits []func() error
	var errs []error
	if err := eachReplay(batch, target, func(l *Letter, t string) error {
		wait, err := send(l, t)
		if err == nil {
			sent, waits = append(sent, l), append(waits, wait)
		}
		return err
	}); err != nil {
		errs = append(errs, err)
	}
	for i, l := range sent {
		if err := waits[i](); err != nil {
			errs = append(errs, err)
			continue
		}
		l.Replayed = true
		// A failed removal leaves a republished copy queued: a duplicate later, harmless.
		if err := remove(l); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// checkOnce returns check's result for key, computed once per key.
func checkOnce(checked map[string]error, key string, check func() error) error {
	err, ok := checked[key]
	if !ok {
		err = check()
		checked[key] = err
	}
	return err
}

// ProgressGroup is the Kafka consumer group under which the replays of
// consumer record their progress.
func ProgressGroup(consumer string) string { return "claimtx-dlq-" + consumer }

// Open opens the poison destination of cfg's broker. Only RabbitMQ, Kafka
// and NATS are supported; another kind is a *framework.ConfigError naming
// "kind" (BROKER when the environment set it).
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
