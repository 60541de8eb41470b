package consumer

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/middleware"
)

// BatchOptions configures RunBatch.
type BatchOptions struct {
	// MaxSize bounds a batch. Defaults to 100.
	MaxSize int
	// MaxWait is how long a batch waits for more messages after its first
	// one. Defaults to 5ms.
	MaxWait time.Duration
	// Workers is the number of batches in flight at once. Defaults to 1.
	Workers int
	// Poison, when its Publisher is set, receives messages that failed
	// permanently (with the reason, as middleware.Poison does); they are
	// then acked. Without it they are nacked.
	Poison middleware.Poison
}

// RunBatch consumes topic from sub in batches until ctx ends: each batch is
// applied by b in one claim transaction, h called once per newly claimed
// message, then every message is acked (applied or duplicate), poisoned
// (permanent failure) or nacked.
//
// How large batches get depends on how many unacked messages the broker
// lets the subscriber hold. Set the adapter's Window (brokers amqp and
// kafka Config.Window) to at least Workers × MaxSize; without it,
// RabbitMQ holds one message per subscription (Concurrency) and
// watermill-kafka one per partition.
func RunBatch(ctx context.Context, sub message.Subscriber, topic string, b middleware.Batch, h middleware.BatchHandlerFunc, opts BatchOptions) error {
	if h == nil {
		return &framework.ConfigError{Field: "handler", Reason: "must not be nil"}
	}
	return runBatches(ctx, sub, topic, b, opts, func(ctx context.Context, msgs []*message.Message) []error {
		return b.Process(ctx, msgs, h)
	})
}

// RunBatchSet is RunBatch with a handler that applies all newly claimed
// messages of a batch at once (middleware.SetHandlerFunc): the fast way,
// since a per-message handler pays its statements' round trips for every
// message.
func RunBatchSet(ctx context.Context, sub message.Subscriber, topic string, b middleware.Batch, h middleware.SetHandlerFunc, opts BatchOptions) error {
	if h == nil {
		return &framework.ConfigError{Field: "handler", Reason: "must not be nil"}
	}
	return runBatches(ctx, sub, topic, b, opts, func(ctx context.Context, msgs []*message.Message) []error {
		return b.ProcessSet(ctx, msgs, h)
	})
}

func runBatches(ctx context.Context, sub message.Subscriber, topic string, b middleware.Batch, opts BatchOptions, process func(context.Context, []*message.Message) []error) error {
	if err := b.Validate(); err != nil {
		return err
	}
	if opts.MaxSize <= 0 {
		opts.MaxSize = 100
	}
	if opts.MaxWait <= 0 {
		opts.MaxWait = 5 * time.Millisecond
	}
	if opts.Workers <= 0 {
		opts.Workers = 1
	}
	poison := opts.Poison.Publisher != nil
	if poison {
		if err := opts.Poison.Validate(); err != nil {
			return err
		}
	}
	ch, err := sub.Subscribe(ctx, topic)
	if err != nil {
		return err
	}
	var wg sync.WaitGroup
	for w := 0; w < opts.Workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				batch, ok := collect(ctx, ch, opts.MaxSize, opts.MaxWait)
				if len(batch) > 0 {
					settle(batch, process(ctx, batch), poison, opts.Poison)
				}
				if !ok {
					return
				}
			}
		}()
	}
	wg.Wait()
	if err := ctx.Err(); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}

// collect blocks for one message, then takes more until max or wait.
func collect(ctx context.Context, ch <-chan *message.Message, max int, wait time.Duration) ([]*message.Message, bool) {
	var batch []*message.Message
	select {
	case m, ok := <-ch:
		if !ok {
			return nil, false
		}
		batch = append(batch, m)
	case <-ctx.Done():
		return nil, false
	}
	timer := time.NewTimer(wait)
	defer timer.Stop()
	for len(batch) < max {
		select {
		case m, ok := <-ch:
			if !ok {
				return batch, false
			}
			batch = append(batch, m)
		case <-timer.C:
			return batch, true
		case <-ctx.Done():
			return batch, false
		}
	}
	return batch, true
}

func settle(batch []*message.Message, errs []error, poison bool, p middleware.Poison) {
	for i, m := range batch {
		err := errs[i]
		switch {
		case err == nil:
			m.Ack()
		case poison && framework.IsPermanent(err):
			// Reuse the poison middleware's copy-with-reason logic.
			_, perr := p.Middleware(func(*message.Message) ([]*message.Message, error) { return nil, err })(m)
			if perr != nil {
				m.Nack()
			} else {
				m.Ack()
			}
		default:
			m.Nack()
		}
	}
}
