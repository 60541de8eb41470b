package consumer

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/claimtx/claimtx/brokers"
	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/internal/pg"
	"github.com/claimtx/claimtx/middleware"
	"github.com/claimtx/claimtx/store"
)

// BatchOptions configures the batches of NewBatch; the retry and shutdown
// policy is Config's.
type BatchOptions struct {
	// MaxSize bounds a batch. Defaults to 100.
	MaxSize int
	// MaxWait is how long a batch waits for more after its first message
	// before a free worker takes it. Defaults to 5ms.
	MaxWait time.Duration
	// Workers bounds the batch transactions in flight. With an order key
	// it must stay 1: two batches in flight would apply one key's messages
	// side by side. Defaults to 1.
	Workers int
	// Poison, when its Publisher is set, replaces Config.PoisonTopic; its
	// hooks run besides the consumer's.
	Poison middleware.Poison
}

// NewBatch is New for a Consumer that applies batches of messages in one
// claim transaction each (middleware.Batch), calling handler with each
// batch's newly claimed messages. See docs/batch.md.
//
// With an order key (Config.OrderKey or Claim.OrderKey) handler gets them
// in delivery order and must apply them in that order, still locking
// shared rows in a deterministic order; a message that fails for good is
// parked instead of poisoned, with the later messages of its key in the
// batch behind it, and the consumer releases parked keys as New's does
// (the release calls handler with one message at a time).
func NewBatch(ctx context.Context, cfg Config, handler middleware.SetHandlerFunc, opts BatchOptions) (*Consumer, error) {
	c, err := newBatch(ctx, cfg, handler, opts)
	return c, cfg.named(err)
}

func newBatch(ctx context.Context, cfg Config, handler middleware.SetHandlerFunc, opts BatchOptions) (_ *Consumer, err error) {
	if handler == nil {
		return nil, &framework.ConfigError{Field: "handler", Reason: "must not be nil"}
	}
	if err := cfg.checkOrdered(true); err != nil {
		return nil, err
	}
	if opts.Workers > 1 && cfg.ordered() {
		return nil, &framework.ConfigError{Field: "BatchOptions.Workers", Reason: fmt.Sprintf("is %d, but ordered effects (OrderKey) need one batch in flight: leave it unset or set it to 1", opts.Workers)}
	}
	for _, f := range []struct {
		name string
		set  bool
	}{{"Retention", cfg.Retention != 0}, {"HandlerTimeout", cfg.HandlerTimeout != 0}, {"Tracer", cfg.Tracer != nil},
		{"Claim.EventTime", cfg.Claim.EventTime != nil}, {"EventTime", cfg.EventTime != ""}} {
		if f.set {
			return nil, &framework.ConfigError{Field: f.name, Reason: "not supported by the batch consumer"}
		}
	}
	// The claim fields batches refuse, before anything connects (validate
	// refused a Store, the claim's last complaint).
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
	l := p.newLedger("") // no router: no handler name
	claim := p.claim
	claim.OnOutcome = l.claimed
	bt, err := middleware.NewBatch(claim)
	if err != nil {
		return nil, claimFieldErr(err)
	}
	poisonMW, err := p.newPoison(l, opts.Poison)
	if err != nil {
		return nil, err
	}
	park, err := p.newParker(claim, releaseHandler(handler), l, poisonMW)
	if err != nil {
		return nil, err
	}
	r := batchRunner{
		sub: p.sub, cfg: p.cfg, opts: opts, settled: l.settle, running: make(chan struct{}),
		process: func(ctx context.Context, msgs []*message.Message) []error {
			return bt.Process(ctx, msgs, handler)
		},
		// The poison and park middleware around a handler returning the
		// error: a failed message of an order key is parked instead.
		poison: func(m *message.Message, err error) error {
			_, perr := poisonMW(park(func(*message.Message) ([]*message.Message, error) { return nil, err }))(m)
			return perr
		},
	}
	// A negative value takes the default too.
	r.opts.MaxSize = cmp.Or(max(r.opts.MaxSize, 0), 100)
	r.opts.MaxWait = cmp.Or(max(r.opts.MaxWait, 0), 5*time.Millisecond)
	r.opts.Workers = cmp.Or(max(r.opts.Workers, 0), 1)
	if kind := p.cfg.Broker.Kind; claim.OrderKey != nil && (kind == "" || kind == brokers.KindAMQP) {
		r.hold = newKeyHold(claim.Key, claim.OrderKey, p.cfg.Logger)
	}
	return &Consumer{parts: p, body: r.run, running: r.running}, nil
}

// releaseHandler is handler for a release of a parked key, which applies
// one message at a time in the claim transaction the message carries.
func releaseHandler(handler middleware.SetHandlerFunc) message.HandlerFunc {
	return func(m *message.Message) ([]*message.Message, error) {
		tx, ok := pg.TxFrom(m.Context())
		if !ok {
			return nil, errors.New("claimtx: release without a claim transaction")
		}
		return nil, handler(m.Context(), tx, []*message.Message{m})
	}
}

// batchRunner consumes cfg.Topic in batches applied by process.
type batchRunner struct {
	sub     message.Subscriber
	cfg     Config // with its defaults
	process func(context.Context, []*message.Message) []error
	opts    BatchOptions // with its defaults
	// settled is told before a message is acked (nil) or nacked: a crash in
	// between is a redelivery, never an ack without its report.
	settled func(*message.Message, error)
	poison  func(*message.Message, error) error // publishes a copy with the reason
	running chan struct{}                       // closed once subscribed
	hold    *keyHold                            // ordered, on RabbitMQ; else nil
}

// run consumes until ctx ends or the subscription does, then drains.
func (r batchRunner) run(ctx context.Context) error {
	opts := r.opts
	// The subscription outlives ctx for the drained batches' acks.
	subCtx, endSubscription := context.WithCancel(context.WithoutCancel(ctx))
	defer endSubscription()
	ch, err := r.sub.Subscribe(subCtx, r.cfg.Topic)
	if err != nil {
		return err
	}
	close(r.running) // Run runs once (parts.run)
	// One collector for all workers: batches grow exactly while every
	// worker is busy.
	batches := make(chan []*message.Message)
	go func() {
		defer close(batches)
		gather(ctx, ch, opts.MaxSize, opts.MaxWait, batches)
	}()
	d := newDrainer(r.cfg.Logger)
	var wg sync.WaitGroup
	for range opts.Workers {
		wg.Go(func() {
			for batch := range batches {
				if !d.enter() {
					r.cfg.Logger.Debug("claimtx: batch arrived during shutdown, handed back to the broker unprocessed", "messages", len(batch))
					nackAll(batch)
					continue
				}
				if r.hold != nil {
					batch = r.hold.admit(batch, func(m *message.Message) { r.nack(m, errHeldBack) })
					if len(batch) == 0 {
						d.leave()
						continue
					}
				}
				// Only the drain timeout cancels work.
				work, cancel := d.context(context.WithoutCancel(ctx))
				r.settle(work, batch, r.process(work, batch))
				cancel()
				d.leave()
			}
		})
	}
	stopped := make(chan struct{})
	go func() { wg.Wait(); close(stopped) }()
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
// batch is offered once full or wait after its first message, and grows up
// to max until taken; what is in hand when ctx ends is nacked.
func gather(ctx context.Context, ch <-chan *message.Message, max int, wait time.Duration, out chan<- []*message.Message) {
	var batch []*message.Message
	ripe := false // wait has passed since the batch's first message
	timer := time.NewTimer(wait)
	timer.Stop()
	defer func() { timer.Stop(); nackAll(batch) }()
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

// settle applies the failure policy (docs/reliability.md) to a batch's
// results, retrying handler failures as Watermill's Retry does. A message
// held behind an earlier failed one of its order key (pg.HeldError) shares
// that one's fate: nacked with it, else run again after it, when it parks
// behind it (or applies, when it is gone).
func (s batchRunner) settle(ctx context.Context, batch []*message.Message, errs []error) {
	delay := s.cfg.RetryInitialInterval
	for retry := 0; ; retry++ {
		var again []*message.Message
		retried := false                   // again holds a failure to wait for
		nacked := make([]bool, len(batch)) // a held message's head's fate
		for i, m := range batch {
			err := errs[i]
			var held *pg.HeldError
			switch {
			case err == nil:
				s.settled(m, nil)
				m.Ack()
			case errors.As(err, &held) && held.Head >= 0 && held.Head < i && !nacked[held.Head]:
				again = append(again, m)
			case ctx.Err() != nil || held != nil || !framework.IsPermanent(err) && store.IsTransient(err):
				s.nack(m, err)
				nacked[i] = true
			case retryable(err) && retry < s.cfg.HandlerRetries:
				again, retried = append(again, m), true
			default:
				nacked[i] = !s.deadLetter(m, err)
			}
		}
		if len(again) == 0 {
			return
		}
		if retried {
			if err := pg.Sleep(ctx, delay); err != nil {
				for _, m := range again {
					s.nack(m, err)
				}
				return
			}
			delay = min(2*delay, 10*s.cfg.RetryInitialInterval)
		}
		batch, errs = again, s.process(ctx, again)
	}
}

// deadLetter poisons (or parks) m and acks it, or nacks it when nothing
// took the copy; it reports whether m was acked.
func (s batchRunner) deadLetter(m *message.Message, err error) bool {
	if err = s.poison(m, err); err == nil {
		s.settled(m, nil)
		m.Ack()
		return true
	}
	s.cfg.Logger.Error("claimtx: message not dead-lettered; nacked, it comes back", "message_uuid", m.UUID, "err", boundError(err))
	s.nack(m, err)
	return false
}

// nack reports m's failure and hands it back to the broker; with an order
// key on RabbitMQ, its key's later messages wait for it (keyHold).
func (s batchRunner) nack(m *message.Message, err error) {
	s.settled(m, err)
	if s.hold != nil {
		s.hold.nacked(m)
	}
	m.Nack()
}
