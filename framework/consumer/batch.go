package consumer

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/internal/pg"
	"github.com/claimtx/claimtx/middleware"
	"github.com/claimtx/claimtx/store"
)

// BatchOptions configures the batches of NewBatch. The retry and shutdown
// policy (HandlerRetries, RetryInitialInterval, DrainTimeout) is Config's,
// the same for both consumers.
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
	// be processed instead of Config.PoisonTopic on Config.Broker, with
	// the reason, as middleware.Poison does: permanent failures at once,
	// handler errors and panics once Config.HandlerRetries are spent; they
	// are then acked. Its OnPoison and OnRefused are called besides the
	// consumer's bookkeeping; its Consumer, Key, SourceTopic and
	// DeadLetters, left empty, are filled with Config.Name, the claim's
	// key, Config.Topic and the consumer's store.
	Poison middleware.Poison
}

// NewBatch validates cfg, connects and migrates like New, for a Consumer
// with the same store, broker clients, poison topic and metrics that
// applies batches of up to opts.MaxSize messages in one claim
// transaction each (middleware.Batch): handler is called once per batch
// with its newly claimed messages, then every message is acked (applied
// or duplicate), poisoned or nacked. opts.Poison defaults to cfg's poison
// topic on cfg's broker.
//
// How large batches get depends on how many unacked messages the broker
// lets the subscriber hold: size cfg.Broker's window (AMQP.Window /
// Kafka.Window) to at least Workers × MaxSize. Without it, RabbitMQ holds
// one message per subscription (Concurrency) and watermill-kafka one per
// partition.
//
// The Config fields of per-message features batches do not have are
// refused with a ConfigError naming them: Claim.Mode (natural key),
// Claim.OutboxTopic, Claim.Fingerprint, Claim.EventTime, Retention,
// HandlerTimeout and Tracer. Failures follow the per-message policy:
// transient ones retry the whole batch up to Claim.MaxAttempts and are
// then nacked, permanent ones are poisoned, handler errors and panics are
// retried HandlerRetries times (from RetryInitialInterval) and then
// poisoned; a shutdown drains as Config.DrainTimeout says.
func NewBatch(ctx context.Context, cfg Config, handler middleware.SetHandlerFunc, opts BatchOptions) (*Consumer, error) {
	c, err := newBatch(ctx, cfg, handler, opts)
	return c, cfg.named(err)
}

func newBatch(ctx context.Context, cfg Config, handler middleware.SetHandlerFunc, opts BatchOptions) (_ *Consumer, err error) {
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
	case cfg.Claim.EventTime != nil:
		return nil, &framework.ConfigError{Field: "Claim.EventTime", Reason: why}
	case cfg.EventTime != "":
		return nil, &framework.ConfigError{Field: "EventTime", Reason: why}
	}
	// The claim fields batches refuse, before anything connects; the
	// claim's other checks run once open has filled Store (validate has
	// made sure the caller left it nil, so the claim reports the fields
	// batches refuse first, then Store).
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if _, err := middleware.NewBatch(cfg.Claim); err != nil {
		var ce *framework.ConfigError
		if !errors.As(err, &ce) || ce.Field != "Store" {
			return nil, claimFieldErr(err)
		}
	}
	p, err := open(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer p.closeOnError(&err)
	byDay, err := p.store.ClaimsByEventDay(ctx)
	if err != nil {
		return nil, err
	}
	if byDay {
		return nil, &framework.ConfigError{Field: "Store", Reason: "the claim table is partitioned by event day, which the batch consumer does not claim by"}
	}
	l := p.newLedger("") // no router: batch messages carry no handler name
	claim := p.claim
	claim.OnOutcome = l.claimed
	bt, err := middleware.NewBatch(claim)
	if err != nil {
		return nil, claimFieldErr(err)
	}
	poisonMW, err := middleware.NewPoison(p.poison(l, opts.Poison))
	if err != nil {
		return nil, err
	}
	r := batchRunner{
		sub: p.sub, cfg: p.cfg, opts: opts, settled: l.settle, running: make(chan struct{}),
		process: func(ctx context.Context, msgs []*message.Message) []error {
			return bt.Process(ctx, msgs, handler)
		},
		// The poison middleware's copy-with-reason logic, around a
		// handler that returns the message's error.
		poison: func(m *message.Message, err error) error {
			_, perr := poisonMW(func(*message.Message) ([]*message.Message, error) { return nil, err })(m)
			return perr
		},
	}
	if r.opts.MaxSize <= 0 {
		r.opts.MaxSize = 100
	}
	if r.opts.MaxWait <= 0 {
		r.opts.MaxWait = 5 * time.Millisecond
	}
	if r.opts.Workers <= 0 {
		r.opts.Workers = 1
	}
	return &Consumer{parts: p, batches: &r}, nil
}

// batchRunner consumes cfg.Topic from sub in batches, each applied by
// process in one claim transaction, and settles every message by the
// failure policy both consumers share (settle).
type batchRunner struct {
	sub     message.Subscriber
	cfg     Config // with its defaults
	process func(context.Context, []*message.Message) []error
	opts    BatchOptions // with its defaults
	// settled is told of every message of a processed batch once it is
	// acked (nil) or nacked (the error), for the one outcome per message.
	settled func(*message.Message, error)
	// poison publishes a copy of the message with the reason.
	poison func(*message.Message, error) error
	// running is closed once the subscription exists (Consumer.Running).
	running chan struct{}
}

// run consumes until ctx ends or the subscription does, then drains.
func (r batchRunner) run(ctx context.Context) error {
	opts := r.opts
	// The subscription outlives ctx: while the batches in flight drain,
	// their acks must still reach the broker.
	subCtx, endSubscription := context.WithCancel(context.WithoutCancel(ctx))
	defer endSubscription()
	ch, err := r.sub.Subscribe(subCtx, r.cfg.Topic)
	if err != nil {
		return err
	}
	close(r.running) // Run runs once (parts.run)
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
	d := newDrainer(r.cfg.Logger)
	var wg sync.WaitGroup
	for w := 0; w < opts.Workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for batch := range batches {
				if !d.enter() {
					r.cfg.Logger.Debug("claimtx: batch arrived during shutdown, handed back to the broker unprocessed", "messages", len(batch))
					nackAll(batch)
					continue
				}
				// Work runs on a context that only the drain timeout
				// cancels, so a shutdown lets it commit.
				work, cancel := d.context(context.WithoutCancel(ctx))
				r.settle(work, batch, r.process(work, batch))
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
		d.drain(r.cfg.DrainTimeout, r.cfg.Logger)
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

// settle applies the failure policy both consumer modes share to the
// results of a batch: applied and duplicate messages are acked; permanent
// failures are poisoned; handler errors and panics are retried in process
// (as Watermill's Retry does per message) and poisoned once
// HandlerRetries are spent; transient database failures, which the batch
// already retried Claim.MaxAttempts times, and work interrupted by
// shutdown are nacked, never poisoned.
func (s batchRunner) settle(ctx context.Context, batch []*message.Message, errs []error) {
	delay := s.cfg.RetryInitialInterval
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
			case retryable(err) && retry < s.cfg.HandlerRetries:
				again = append(again, m)
			default:
				s.deadLetter(m, err)
			}
		}
		if len(again) == 0 {
			return
		}
		if err := pg.Sleep(ctx, delay); err != nil {
			for _, m := range again {
				s.done(m, err)
				m.Nack()
			}
			return
		}
		delay = min(2*delay, 10*s.cfg.RetryInitialInterval)
		batch, errs = again, s.process(ctx, again)
	}
}

// deadLetter poisons m with the reason and acks it, or nacks it when the
// message could be put neither in the poison topic nor in the dead-letter
// table. That nack is logged at ERROR, as the per-message router logs it,
// with the error bounded.
func (s batchRunner) deadLetter(m *message.Message, err error) {
	if err = s.poison(m, err); err == nil {
		s.done(m, nil)
		m.Ack()
		return
	}
	s.cfg.Logger.Error("claimtx: message not dead-lettered; nacked, it comes back", "message_uuid", m.UUID, "err", boundError(err))
	s.done(m, err)
	m.Nack()
}

// done reports that m is about to be acked (err nil) or nacked. Before,
// not after: like the per-message router, which acks once the middleware
// chain returned, so a crash between the report and the ack is a
// redelivery, never an ack without its report.
func (s batchRunner) done(m *message.Message, err error) {
	s.settled(m, err)
}
