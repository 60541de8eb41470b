package amqp

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/claimtx/claimtx/brokers"
	"github.com/claimtx/claimtx/brokers/internal/wait"
	"github.com/claimtx/claimtx/internal/amqpheader"
)

// Subscriber consumes from RabbitMQ: brokers.AMQPConfig.Concurrency consumers per
// Subscribe call, each settling one message before it takes the next,
// merged into one channel, with a delayed nack; or, with brokers.AMQPConfig.Window > 0,
// one consumer per Subscribe call with up to Window messages in flight. It
// is safe for concurrent use.
type Subscriber struct {
	link

	// life ends when Close starts; every subscription's context is cut
	// short by it. mu orders Subscribe's forwarders.Add before Close's
	// Wait.
	mu         sync.Mutex
	life       context.Context
	end        context.CancelFunc
	closeOnce  sync.Once
	closeErr   error
	forwarders sync.WaitGroup
}

var (
	_ message.Subscriber           = (*Subscriber)(nil)
	_ message.SubscribeInitializer = (*Subscriber)(nil)
)

// NewSubscriber validates cfg, connects to RabbitMQ (retrying until
// cfg.DialTimeout passes or ctx ends, see brokers.AMQPConfig.DialTimeout) and returns a
// Subscriber owning that connection. ctx bounds the start-up only, not the
// Subscriber's life. A nil logger logs nothing. An invalid cfg is a
// *framework.ConfigError; giving up on the connection is a *DialError.
func NewSubscriber(ctx context.Context, cfg brokers.AMQPConfig, logger watermill.LoggerAdapter) (*Subscriber, error) {
	l, err := connect(ctx, cfg, logger)
	if err != nil {
		return nil, err
	}
	life, end := context.WithCancel(context.Background())
	return &Subscriber{link: l, life: life, end: end}, nil
}

// Subscribe declares the durable queue named topic (if missing) and starts
// brokers.AMQPConfig.Concurrency consumers on it. The returned channel is closed when ctx
// ends or the Subscriber is closed. Each message must be acked or nacked; a
// nacked message is returned to the queue after brokers.AMQPConfig.NackDelay.
//
// Messages of one Subscribe call are processed up to Concurrency at a time,
// so their order is not kept when Concurrency > 1.
//
// With brokers.AMQPConfig.Window > 0 it starts one consumer instead, which keeps up to
// Window messages in flight (see brokers.AMQPConfig.Window).
//
// Each consumer's channel is opened here, so a queue that cannot be
// declared or consumed (PRECONDITION_FAILED, access refused) fails
// Subscribe; a channel lost later is reopened with backoff.
func (s *Subscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	if s.life.Err() != nil {
		return nil, errSubscriberClosed
	}
	if err := waitConnected(ctx, s.cfg, s.conn); err != nil {
		return nil, err
	}
	n, prefetch := s.cfg.Concurrency, s.cfg.Prefetch
	if s.cfg.Window > 0 {
		n, prefetch = 1, s.cfg.Window
	}
	out := make(chan *message.Message)
	cs := make([]*consumer, n)
	gens := make([]*generation, 0, n)
	abort := func(err error) (<-chan *message.Message, error) {
		for _, g := range gens {
			_ = g.ch.Close()
		}
		return nil, err
	}
	for i := range cs {
		cs[i] = &consumer{s: s, topic: topic, prefetch: prefetch, sequential: s.cfg.Window == 0, out: out,
			logFields: watermill.LogFields{"topic": topic, "consumer": i + 1, "window": s.cfg.Window}}
		gen, err := cs[i].open()
		if err != nil {
			what := fmt.Sprintf("consumer %d of %d", i+1, n)
			if s.cfg.Window > 0 {
				what = fmt.Sprintf("window %d", s.cfg.Window)
			}
			return abort(fmt.Errorf("brokers/amqp: subscribe to %q (%s): %w", topic, what, err))
		}
		gens = append(gens, gen)
	}
	// Close waits for the n consumers and for the goroutine that closes out
	// once they are done, so it returns after the channel is closed.
	s.mu.Lock()
	if s.life.Err() != nil {
		s.mu.Unlock()
		return abort(errSubscriberClosed)
	}
	s.forwarders.Add(n + 1)
	s.mu.Unlock()
	// The consumers' context ends with ctx or when the Subscriber closes, so
	// everything they do watches one Done channel (waitConnected included).
	cctx, cancel := context.WithCancel(ctx)
	stopOnClose := context.AfterFunc(s.life, cancel)
	var wg sync.WaitGroup
	wg.Add(n)
	for i, c := range cs {
		c.ctx = cctx
		go func() {
			defer s.forwarders.Done()
			defer wg.Done()
			c.run(gens[i])
		}()
	}
	go func() {
		defer s.forwarders.Done()
		wg.Wait()
		stopOnClose()
		cancel()
		close(out)
	}()
	return out, nil
}

var errSubscriberClosed = errors.New("brokers/amqp: subscriber closed")

// SubscribeInitialize declares the durable queue named topic without
// consuming from it, so messages published before the first Subscribe are
// kept.
func (s *Subscriber) SubscribeInitialize(topic string) error {
	if err := waitConnected(context.Background(), s.cfg, s.conn); err != nil {
		return err
	}
	if err := s.declareQueue(topic); err != nil {
		return fmt.Errorf("brokers/amqp: declare queue %q: %w", topic, err)
	}
	return nil
}

// Close stops every subscription (unacked messages go back to their queue),
// waits for them, and closes the connection. It is idempotent.
func (s *Subscriber) Close() error {
	s.closeOnce.Do(func() {
		s.mu.Lock()
		s.end()
		s.mu.Unlock()
		s.forwarders.Wait()
		s.closeErr = s.conn.Close()
	})
	return s.closeErr
}

// IsConnected reports whether the subscriber's RabbitMQ connection is up:
// false from the moment RabbitMQ or the network drops it until
// watermill-amqp's reconnect succeeds, and after Close.
// observe.SubscriberConnected uses it for readiness.
//
// It reads watermill-amqp's connection state, which that library's
// reconnect writes without synchronisation (see the package doc), so a
// readiness probe during a reconnect is reported by -race as is
// waitConnected.
func (s *Subscriber) IsConnected() bool {
	return s.life.Err() == nil && s.conn.IsConnected() && !s.conn.Closed()
}

// consumer is one amqp091 consumer of a Subscribe call, on a channel of
// its own with QoS prefetch = prefetch. In the window mode (sequential
// false) it forwards the next delivery without waiting for the previous
// one's ack, and each forwarded message is settled by a small goroutine of
// its own, on the channel its delivery came from. In the per-subscription
// mode (sequential) it settles each message before it takes the next, as a
// watermill-amqp subscription does: one delivery at a time.
type consumer struct {
	s          *Subscriber
	ctx        context.Context
	topic      string
	prefetch   int
	sequential bool
	out        chan<- *message.Message
	logFields  watermill.LogFields
}

// generation is one AMQP channel and its consumer. Delivery tags are per
// channel, and a delivery is only ever acked or nacked through its own
// Acknowledger, which is ch: a message from an older generation can never
// settle a delivery of a newer one.
type generation struct {
	ch         *amqp091.Channel
	acks       *acker
	deliveries <-chan amqp091.Delivery
	// ending is closed when the generation stops: each settle goroutine
	// then passes on an ack that already happened and returns.
	ending   chan struct{}
	settling sync.WaitGroup
}

// close ends the generation: acks given before it are sent, then the channel
// is closed, which makes RabbitMQ requeue every delivery still unacked
// (those not acked yet, and those whose nack delay is running). A later Ack
// or Nack of their messages has no effect; the redelivery is deduplicated
// by the claim.
func (g *generation) close() {
	close(g.ending)
	g.settling.Wait()
	g.acks.close()
	_ = g.ch.Close() // fails when the channel or connection is already gone
}

// open declares the queue, opens a channel with the consumer's prefetch and
// starts consuming.
func (w *consumer) open() (*generation, error) {
	// Declare the queue exactly as the publisher does (same name, durable
	// flag and arguments), so that both find the queue they expect.
	if err := w.s.declareQueue(w.topic); err != nil {
		return nil, fmt.Errorf("declare queue %q: %w", w.topic, err)
	}
	conn := w.s.conn.Connection()
	if conn == nil {
		return nil, errors.New("not connected to AMQP")
	}
	ch, err := conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("open channel: %w", err)
	}
	if err := ch.Qos(w.prefetch, 0, false); err != nil {
		_ = ch.Close()
		return nil, fmt.Errorf("set prefetch %d: %w", w.prefetch, err)
	}
	c := w.s.wc.Consume
	tag := w.s.cfg.ConnectionName + "-" + watermill.NewShortUUID()
	queue := w.s.wc.Queue.GenerateName(w.topic)
	deliveries, err := ch.Consume(queue, tag, false, c.Exclusive, c.NoLocal, c.NoWait, c.Arguments)
	if err != nil {
		_ = ch.Close()
		return nil, fmt.Errorf("consume from %q: %w", queue, err)
	}
	w.s.logger.Info("Started AMQP consumer", w.logFields.Add(watermill.LogFields{"consumer_tag": tag}))
	return &generation{ch: ch, acks: newAcker(ch), deliveries: deliveries, ending: make(chan struct{})}, nil
}

// run consumes until w.ctx ends, replacing the channel whenever it is lost.
func (w *consumer) run(gen *generation) {
	for {
		stop := w.consume(gen)
		gen.close()
		if stop {
			return
		}
		w.s.logger.Info("AMQP channel of the consumer closed, reopening", w.logFields)
		if gen = w.reopen(); gen == nil {
			return
		}
	}
}

// reopen waits for the connection and opens a new generation, retrying with
// backoff (ReconnectInitialInterval doubling to ReconnectMaxInterval). It
// returns nil when w.ctx ends first.
func (w *consumer) reopen() *generation {
	backoff := w.s.cfg.ReconnectInitialInterval
	for {
		err := waitConnected(w.ctx, w.s.cfg, w.s.conn)
		if err == nil {
			var gen *generation
			if gen, err = w.open(); err == nil {
				return gen
			}
		}
		if w.ctx.Err() != nil {
			return nil
		}
		w.s.logger.Error("Cannot resume the AMQP consumer, retrying", err,
			w.logFields.Add(watermill.LogFields{"retry_in": backoff.String()}))
		if !wait.For(backoff, w.ctx.Done()) {
			return nil
		}
		backoff = min(2*backoff, w.s.cfg.ReconnectMaxInterval)
	}
}

// consume forwards gen's deliveries to out until the deliveries channel
// closes (channel or connection lost, consumer cancelled by RabbitMQ:
// returns false) or w.ctx ends (returns true). A delivery not handed over
// yet stays unacked and goes back with the channel.
func (w *consumer) consume(gen *generation) (stop bool) {
	for {
		var d amqp091.Delivery
		select {
		case <-w.ctx.Done():
			return true
		case dd, ok := <-gen.deliveries:
			if !ok {
				return false
			}
			d = dd
		}
		msg := amqpheader.ToMessage(d)
		// The redelivered flag under watermill-amqp's key, as its
		// subscriptions set it.
		if d.Redelivered {
			msg.Metadata.Set(metadataRedelivered, "true")
		}
		// Like watermill-amqp: the message's context ends once it is
		// settled or the subscription ends.
		mctx, cancel := context.WithCancel(w.ctx)
		msg.SetContext(mctx)

		gen.acks.delivered(d.DeliveryTag)
		select {
		case w.out <- msg:
		case <-w.ctx.Done():
			cancel()
			return true
		}
		if w.sequential {
			w.settle(gen, d, msg, w.ctx.Done())
			cancel()
			continue
		}
		gen.settling.Add(1)
		go func() {
			defer gen.settling.Done()
			defer cancel()
			w.settle(gen, d, msg, gen.ending)
		}()
	}
}

// settle waits for msg's Ack or Nack and passes it on to d's channel: an
// ack through the generation's acker, which coalesces acks; a nack is held
// for NackDelay first (only this message's slot stays taken meanwhile).
// When stop is closed first (the generation ends; in the per-subscription
// mode, the subscription) it passes on an ack that already happened and
// returns: closing the channel requeues the rest. Errors are ignored: they
// mean the channel is gone, and RabbitMQ redelivers whatever it had not
// been told (claims dedupe).
func (w *consumer) settle(gen *generation, d amqp091.Delivery, msg *message.Message, stop <-chan struct{}) {
	select {
	case <-msg.Acked():
		gen.acks.ack(d.DeliveryTag)
	case <-msg.Nacked():
		if !wait.For(w.s.cfg.NackDelay, stop) {
			return // closing the channel requeues it now
		}
		_ = d.Nack(false, true)
		gen.acks.settled(d.DeliveryTag)
	case <-stop:
		// An ack given before the stop still counts, even when this
		// goroutine had not seen it yet (select picks at random).
		select {
		case <-msg.Acked():
			gen.acks.ack(d.DeliveryTag)
		default:
		}
	}
}
