package amqp

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"reflect"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/claimtx/claimtx/brokers"
	"github.com/claimtx/claimtx/brokers/internal/wait"
	"github.com/claimtx/claimtx/internal/amqpheader"
)

type subscriber struct {
	link

	// life ends when Close starts, and with it every subscription; mu
	// orders Subscribe's forwarders.Add before Close's Wait.
	mu         sync.Mutex
	life       context.Context
	end        context.CancelFunc
	close      func() error // sync.OnceValue
	forwarders sync.WaitGroup
}

var (
	_ message.Subscriber           = (*subscriber)(nil)
	_ message.SubscribeInitializer = (*subscriber)(nil)
)

// NewSubscriber validates cfg and connects to RabbitMQ, retrying until
// DialTimeout passes or ctx ends (ctx bounds the start-up only). A nil
// logger logs nothing. An invalid cfg is a *framework.ConfigError; giving
// up on the connection is a *DialError. The subscriber is safe for
// concurrent use and also has SubscribeInitialize, IsConnected (readiness,
// observe.SubscriberConnected) and ReplayHorizon (see brokers.UnboundedHorizon).
func NewSubscriber(ctx context.Context, cfg brokers.AMQPConfig, logger watermill.LoggerAdapter) (message.Subscriber, error) {
	l, err := connect(ctx, cfg, logger)
	if err != nil {
		return nil, err
	}
	life, end := context.WithCancel(context.Background())
	s := &subscriber{link: l, life: life, end: end}
	s.close = sync.OnceValue(func() error {
		s.mu.Lock()
		s.end()
		s.mu.Unlock()
		s.forwarders.Wait()
		return s.conn.Close()
	})
	return s, nil
}

// Subscribe declares the durable queue named topic and starts its
// consumers; the channel is closed when ctx ends or the Subscriber closes.
// A nacked message returns to the queue after NackDelay. Channels are
// opened here, so a queue that cannot be declared or consumed fails
// Subscribe; a channel lost later is reopened with backoff.
func (s *subscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	if s.life.Err() != nil {
		return nil, errSubscriberClosed
	}
	if err := waitConnected(ctx, s.cfg, s.conn); err != nil {
		return nil, err
	}
	n := s.cfg.Concurrency
	if s.cfg.Window > 0 {
		n = 1
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
		cs[i] = &consumer{s: s, topic: topic, out: out,
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
	s.mu.Lock()
	if s.life.Err() != nil {
		s.mu.Unlock()
		return abort(errSubscriberClosed)
	}
	s.forwarders.Add(1)
	s.mu.Unlock()
	cctx, cancel := context.WithCancel(ctx)
	stopOnClose := context.AfterFunc(s.life, cancel)
	go func() {
		defer s.forwarders.Done()
		var wg sync.WaitGroup
		for i, c := range cs {
			c.ctx = cctx
			wg.Go(func() { c.run(gens[i]) })
		}
		wg.Wait()
		stopOnClose()
		cancel()
		close(out)
	}()
	return out, nil
}

var errSubscriberClosed = errors.New("brokers/amqp: subscriber closed")

// SubscribeInitialize declares the durable queue named topic, so messages
// published before the first Subscribe are kept.
func (s *subscriber) SubscribeInitialize(topic string) error {
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
func (s *subscriber) Close() error { return s.close() }

// IsConnected reports whether the RabbitMQ connection is up (false while
// watermill-amqp reconnects, and after Close), for readiness. During a
// reconnect -race reports it: see the package documentation.
func (s *subscriber) IsConnected() bool {
	return s.life.Err() == nil && s.conn.IsConnected() && !s.conn.Closed()
}

// consumer is one amqp091 consumer of a Subscribe call, on a channel of its
// own. Sequential, it settles each message before it takes the next; in the
// window mode a goroutine per message settles it.
type consumer struct {
	s         *subscriber
	ctx       context.Context
	topic     string
	out       chan<- *message.Message
	logFields watermill.LogFields
}

// generation is one AMQP channel and its consumer. A delivery is settled
// only on its own channel, so a message of an older generation never
// settles one of a newer.
type generation struct {
	ch         *amqp091.Channel
	acks       *acker
	deliveries <-chan amqp091.Delivery
	ending     chan struct{} // closed when the generation stops
	settling   sync.WaitGroup
}

// close sends the acks given, then closes the channel, which requeues every
// delivery still unacked (nack delays running included); later acks of
// them do nothing.
func (g *generation) close() {
	close(g.ending)
	g.settling.Wait()
	g.acks.close()
	_ = g.ch.Close() // fails when the channel or connection is already gone
}

// open declares the queue as the publisher does, opens a channel with the
// consumer's prefetch and starts consuming.
func (w *consumer) open() (*generation, error) {
	if err := w.s.declareQueue(w.topic); err != nil {
		return nil, fmt.Errorf("declare queue %q: %w", w.topic, err)
	}
	ch, err := w.s.channel()
	if err != nil {
		return nil, err
	}
	prefetch := cmp.Or(w.s.cfg.Window, w.s.cfg.Prefetch) // the window replaces Prefetch
	if err := ch.Qos(prefetch, 0, false); err != nil {
		_ = ch.Close()
		return nil, fmt.Errorf("set prefetch %d: %w", prefetch, err)
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

// reopen waits for the connection and opens a new generation, with the
// Reconnect* backoff; nil when w.ctx ends first.
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

// consume forwards gen's deliveries until their channel closes (channel or
// connection lost, consumer cancelled: false) or w.ctx ends (true).
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
		if d.Redelivered {
			msg.Metadata.Set(metadataRedelivered, "true")
		}
		// As in watermill-amqp, it ends once settled or with the subscription.
		mctx, cancel := context.WithCancel(w.ctx)
		msg.SetContext(mctx)

		gen.acks.delivered(d.DeliveryTag)
		select {
		case w.out <- msg:
		case <-w.ctx.Done():
			cancel()
			return true
		}
		if w.s.cfg.Window == 0 {
			w.settle(gen, d, msg, w.ctx.Done())
			cancel()
			continue
		}
		gen.settling.Go(func() {
			w.settle(gen, d, msg, gen.ending)
			// Work in hand outlives a lost channel, as in the sequential
			// mode: it commits, and the redelivery is a duplicate, instead
			// of every message of the window failing at once.
			go func() {
				defer cancel()
				select {
				case <-msg.Acked():
				case <-msg.Nacked():
				case <-w.ctx.Done():
				}
			}()
		})
	}
}

// settle passes msg's Ack (through the coalescing acker) or Nack (after
// NackDelay) on to d's channel. When stop closes first it passes on an ack
// already given and returns: closing the channel requeues the rest. Errors
// mean the channel is gone: RabbitMQ redelivers, claims dedupe.
func (w *consumer) settle(gen *generation, d amqp091.Delivery, msg *message.Message, stop <-chan struct{}) {
	select {
	case <-msg.Acked():
		gen.acks.ack(d.DeliveryTag)
	case <-msg.Nacked():
		if !wait.For(w.s.cfg.NackDelay, stop) {
			return
		}
		_ = d.Nack(false, true)
		gen.acks.settled(d.DeliveryTag)
	case <-stop:
		// An ack given before the stop counts (select picks at random).
		select {
		case <-msg.Acked():
			gen.acks.ack(d.DeliveryTag)
		default:
		}
	}
}

// ReplayHorizon reports how old a message of topic can be when RabbitMQ
// still delivers it: QueueArguments' x-message-ttl, else
// brokers.UnboundedHorizon (a TTL set by a server policy is not visible
// over AMQP). A consumer compares it with its claim retention.
func (s *subscriber) ReplayHorizon(ctx context.Context, topic string) (time.Duration, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	v, ok := s.cfg.QueueArguments["x-message-ttl"]
	if !ok {
		return brokers.UnboundedHorizon, nil
	}
	var ms int64
	switch n := v.(type) {
	case int, int32, int64:
		ms = reflect.ValueOf(n).Int()
	case float64:
		ms = int64(n)
	default:
		return 0, fmt.Errorf("brokers/amqp: replay horizon of %q: x-message-ttl %v (%T) is not a number", topic, v, v)
	}
	if ms < 0 || ms >= math.MaxInt64/int64(time.Millisecond) {
		return brokers.UnboundedHorizon, nil
	}
	return time.Duration(ms) * time.Millisecond, nil
}
