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
	// one before it is handed to a free worker; while every worker is busy
	// it keeps growing up to MaxSize. Defaults to 5ms.
	MaxWait time.Duration
	// Workers is the number of batch transactions in flight at once.
	// Defaults to 1.
	Workers int
	// Poison, when its Publisher is set, receives messages that failed
	// permanently (with the reason, as middleware.Poison does); they are
	// then acked. Without it they are nacked.
	Poison middleware.Poison
}

// BatchConsumer is the batch counterpart of Consumer, built by NewBatch
// from the same Config: the same store, broker clients, poison topic and
// metrics, with batches of messages applied by a set-wise handler.
type BatchConsumer struct {
	*parts
	batch   middleware.Batch
	handler middleware.SetHandlerFunc
	opts    BatchOptions
}

// NewBatch validates cfg, connects and migrates like New, for a consumer
// that applies batches of up to opts.MaxSize messages in one claim
// transaction each (see RunBatchSet). opts.Poison defaults to cfg's poison
// topic on cfg's broker. Size the broker's window for it (cfg.Broker's
// AMQP.Window / Kafka.Window: at least Workers × MaxSize).
//
// The Config fields of per-message features batches do not have are
// refused with a ConfigError naming them: Mode (natural key),
// OutboxTopic, Fingerprint, EventTime, Retention, HandlerTimeout and
// Tracer. HandlerRetries does not apply: transient failures retry the
// whole batch up to MaxAttempts, permanent ones are poisoned.
func NewBatch(ctx context.Context, cfg Config, handler middleware.SetHandlerFunc, opts BatchOptions) (_ *BatchConsumer, err error) {
	if handler == nil {
		return nil, &framework.ConfigError{Field: "handler", Reason: "must not be nil"}
	}
	const why = "not supported by the batch consumer"
	switch {
	case cfg.Retention != 0:
		return nil, &framework.ConfigError{Field: "Retention", Reason: why}
	case cfg.HandlerTimeout != 0:
		return nil, &framework.ConfigError{Field: "HandlerTimeout", Reason: why}
	case cfg.Tracer != nil:
		return nil, &framework.ConfigError{Field: "Tracer", Reason: why}
	case cfg.EventTime != nil:
		return nil, &framework.ConfigError{Field: "EventTime", Reason: why}
	}
	bt := middleware.Batch{Claim: middleware.Claim{Mode: cfg.Mode, OutboxTopic: cfg.OutboxTopic, Fingerprint: cfg.Fingerprint}}
	if err := bt.Validate(); err != nil {
		var ce *framework.ConfigError
		if errors.As(err, &ce) && ce.Field != "Store" { // Store is set by open
			return nil, err
		}
	}
	p, err := open(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			_ = p.Close()
		}
	}()
	byDay, err := p.store.ClaimsByEventDay(ctx)
	if err != nil {
		return nil, err
	}
	if byDay {
		return nil, &framework.ConfigError{Field: "Store", Reason: "the claim table is partitioned by event day, which the batch consumer does not claim by"}
	}
	bt = middleware.Batch{Claim: p.claim}
	if err := bt.Validate(); err != nil {
		return nil, err
	}
	if opts.Poison.Publisher == nil {
		opts.Poison = p.poison()
	}
	return &BatchConsumer{parts: p, batch: bt, handler: handler, opts: opts}, nil
}

// Run consumes in batches until ctx is cancelled; see RunBatchSet.
func (c *BatchConsumer) Run(ctx context.Context) error {
	return RunBatchSet(ctx, c.sub, c.cfg.Topic, c.batch, c.handler, c.opts)
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
	// One collector fills batches and hands each to whichever worker is
	// free: while every worker is busy the batch in hand keeps growing up
	// to MaxSize, so batches are large exactly when the consumer is
	// loaded. (Workers collecting on their own split the stream between
	// them and end up with Workers small batches instead.)
	batches := make(chan []*message.Message)
	go func() {
		defer close(batches)
		gather(ctx, ch, opts.MaxSize, opts.MaxWait, batches)
	}()
	var wg sync.WaitGroup
	for w := 0; w < opts.Workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for batch := range batches {
				settle(batch, process(ctx, batch), poison, opts.Poison)
			}
		}()
	}
	wg.Wait()
	if err := ctx.Err(); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}

// gather reads ch into batches for out until ch closes or ctx ends. A
// batch is offered to the workers once it is full or wait has passed since
// its first message; until a worker takes it, it keeps growing up to max.
// Messages in hand when ctx ends are nacked (they go back to the broker).
func gather(ctx context.Context, ch <-chan *message.Message, max int, wait time.Duration, out chan<- []*message.Message) {
	var batch []*message.Message
	ripe := false // wait has passed since the batch's first message
	timer := time.NewTimer(wait)
	timer.Stop()
	defer func() {
		timer.Stop()
		for _, m := range batch {
			m.Nack()
		}
	}()
	for {
		in := ch
		var offer chan<- []*message.Message
		var expire <-chan time.Time
		switch {
		case len(batch) >= max:
			in, offer = nil, out
		case ripe:
			offer = out
		case len(batch) > 0:
			expire = timer.C
		}
		select {
		case m, ok := <-in:
			if !ok {
				if len(batch) > 0 {
					select {
					case out <- batch:
						batch = nil
					case <-ctx.Done():
					}
				}
				return
			}
			if len(batch) == 0 {
				timer.Reset(wait)
			}
			batch = append(batch, m)
		case offer <- batch:
			batch, ripe = nil, false
			timer.Stop()
		case <-expire:
			ripe = true
		case <-ctx.Done():
			return
		}
	}
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
