package consumer

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/internal/timing"
	"github.com/claimtx/claimtx/middleware"
	"github.com/claimtx/claimtx/store"
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
	// Poison, when its Publisher is set, receives the messages that cannot
	// be processed (with the reason, as middleware.Poison does): permanent
	// failures at once, handler errors and panics once HandlerRetries are
	// spent; they are then acked. Without it they are nacked.
	Poison middleware.Poison
	// HandlerRetries and RetryInitialInterval are Config's: a message
	// whose handler failed (an error or a panic, not a permanent or a
	// transient database failure) is retried in process, with its batch's
	// other failures, that many times with exponential backoff before it
	// is poisoned. Defaults: DefaultHandlerRetries, 100ms.
	HandlerRetries       int
	RetryInitialInterval time.Duration
	// DrainTimeout is Config.DrainTimeout: when ctx ends, no new batch
	// starts and the batches in flight get this long to commit and be
	// acked; the rest is cancelled and nacked, never poisoned. Defaults
	// to DefaultDrainTimeout.
	DrainTimeout time.Duration

	logger *slog.Logger // Config.Logger, set by NewBatch
	// settled, set by NewBatch, is told of every message of a processed
	// batch once it is acked (nil) or nacked (the error), for the one
	// outcome per message.
	settled func(*message.Message, error)
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
// Tracer. Failures follow the per-message policy: transient ones retry the
// whole batch up to MaxAttempts and are then nacked, permanent ones are
// poisoned, handler errors and panics are retried HandlerRetries times and
// then poisoned; cfg.HandlerRetries, RetryInitialInterval and DrainTimeout
// fill opts' zero fields.
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
	l := p.newLedger("") // no router: batch messages carry no handler name
	bt = middleware.Batch{Claim: p.claim}
	bt.OnOutcome = l.claimed
	if err := bt.Validate(); err != nil {
		return nil, err
	}
	if opts.Poison.Publisher == nil {
		opts.Poison = p.poison(l)
	} else {
		// The caller's poison route: its copies are outcomes too.
		onPoison := opts.Poison.OnPoison
		opts.Poison.OnPoison = func(msg *message.Message, err error) {
			if onPoison != nil {
				onPoison(msg, err)
			}
			l.poisoned(msg, err)
		}
	}
	opts.settled = l.settle
	cfg = p.cfg
	if opts.HandlerRetries == 0 {
		opts.HandlerRetries = cfg.HandlerRetries
	}
	if opts.RetryInitialInterval == 0 {
		opts.RetryInitialInterval = cfg.RetryInitialInterval
	}
	if opts.DrainTimeout == 0 {
		opts.DrainTimeout = cfg.DrainTimeout
	}
	opts.logger = cfg.Logger
	return &BatchConsumer{parts: p, batch: bt, handler: handler, opts: opts}, nil
}

// Run consumes in batches until ctx is cancelled or Close is called, then
// shuts down gracefully (see BatchOptions.DrainTimeout); see RunBatchSet.
func (c *BatchConsumer) Run(ctx context.Context) error {
	return c.run(ctx, func(ctx context.Context) error {
		return RunBatchSet(ctx, c.sub, c.cfg.Topic, c.batch, c.handler, c.opts)
	})
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
	switch {
	case opts.HandlerRetries < 0:
		return &framework.ConfigError{Field: "HandlerRetries", Reason: "must not be negative"}
	case opts.RetryInitialInterval < 0:
		return &framework.ConfigError{Field: "RetryInitialInterval", Reason: "must not be negative"}
	case opts.DrainTimeout < 0:
		return &framework.ConfigError{Field: "DrainTimeout", Reason: "must not be negative"}
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
	if opts.HandlerRetries == 0 {
		opts.HandlerRetries = DefaultHandlerRetries
	}
	if opts.RetryInitialInterval == 0 {
		opts.RetryInitialInterval = DefaultRetryInitialInterval
	}
	if opts.DrainTimeout == 0 {
		opts.DrainTimeout = DefaultDrainTimeout
	}
	s := settler{opts: opts, process: process}
	if opts.Poison.Publisher != nil {
		mw, err := middleware.NewPoison(opts.Poison)
		if err != nil {
			return err
		}
		// The poison middleware's copy-with-reason logic, around a handler
		// that returns the message's error.
		s.poison = func(m *message.Message, err error) error {
			_, perr := mw(func(*message.Message) ([]*message.Message, error) { return nil, err })(m)
			return perr
		}
	}
	// The subscription outlives ctx: while the batches in flight drain,
	// their acks must still reach the broker.
	subCtx, endSubscription := context.WithCancel(context.WithoutCancel(ctx))
	defer endSubscription()
	ch, err := sub.Subscribe(subCtx, topic)
	if err != nil {
		return err
	}
	// One collector fills batches and hands each to whichever worker is
	// free: while every worker is busy the batch in hand keeps growing up
	// to MaxSize, so batches are large exactly when the consumer is
	// loaded. (Workers collecting on their own split the stream between
	// them and end up with Workers small batches instead.) It stops
	// taking messages when ctx ends.
	batches := make(chan []*message.Message)
	go func() {
		defer close(batches)
		gather(ctx, ch, opts.MaxSize, opts.MaxWait, batches)
	}()
	d := newDrainer()
	var wg sync.WaitGroup
	for w := 0; w < opts.Workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for batch := range batches {
				if !d.enter() {
					nackAll(batch)
					continue
				}
				// Work runs on a context that only the drain timeout
				// cancels, so a shutdown lets it commit.
				work, cancel := d.context(context.WithoutCancel(ctx))
				s.settle(work, batch, process(work, batch))
				cancel()
				d.leave()
			}
		}()
	}
	stopped := make(chan struct{})
	go func() {
		wg.Wait()
		close(stopped)
	}()
	select {
	case <-stopped: // the subscription ended by itself
	case <-ctx.Done():
		logger := opts.logger
		if logger == nil {
			logger = slog.Default()
		}
		d.drain(opts.DrainTimeout, logger)
	}
	endSubscription()
	<-stopped
	if err := ctx.Err(); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}

func nackAll(msgs []*message.Message) {
	for _, m := range msgs {
		m.Nack()
	}
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

// settler applies the failure policy both consumer modes share to the
// results of a batch: applied and duplicate messages are acked; permanent
// failures are poisoned; handler errors and panics are retried in process
// (as Watermill's Retry does per message) and poisoned once
// HandlerRetries are spent; transient database failures, which the batch
// already retried MaxAttempts times, and work interrupted by shutdown are
// nacked, never poisoned.
type settler struct {
	opts    BatchOptions
	process func(context.Context, []*message.Message) []error
	// poison publishes a copy of the message with the reason; nil when no
	// poison destination is configured.
	poison func(*message.Message, error) error
}

func (s settler) settle(ctx context.Context, batch []*message.Message, errs []error) {
	delay := s.opts.RetryInitialInterval
	for retry := 0; ; retry++ {
		var again []*message.Message
		for i, m := range batch {
			err := errs[i]
			switch {
			case err == nil:
				s.done(m, nil)
				m.Ack()
			case ctx.Err() != nil || !framework.IsPermanent(err) && store.IsTransient(err):
				s.done(m, err)
				m.Nack()
			case retryable(err) && retry < s.opts.HandlerRetries:
				again = append(again, m)
			default:
				s.deadLetter(m, err)
			}
		}
		if len(again) == 0 {
			return
		}
		if err := timing.Sleep(ctx, delay); err != nil {
			for _, m := range again {
				s.done(m, err)
				m.Nack()
			}
			return
		}
		delay = min(2*delay, 10*s.opts.RetryInitialInterval)
		batch, errs = again, s.process(ctx, again)
	}
}

// deadLetter poisons m with the reason and acks it, or nacks it when no
// poison destination is configured or the copy could not be published.
func (s settler) deadLetter(m *message.Message, err error) {
	if s.poison != nil {
		if err = s.poison(m, err); err == nil {
			s.done(m, nil)
			m.Ack()
			return
		}
	}
	s.done(m, err)
	m.Nack()
}

// done reports that m is about to be acked (err nil) or nacked. Before,
// not after: like the per-message router, which acks once the middleware
// chain returned, so a crash between the report and the ack is a
// redelivery, never an ack without its report.
func (s settler) done(m *message.Message, err error) {
	if s.opts.settled != nil {
		s.opts.settled(m, err)
	}
}
