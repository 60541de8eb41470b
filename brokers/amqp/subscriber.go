package amqp

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/ThreeDotsLabs/watermill"
	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/claimtx/claimtx/brokers/internal/wait"
)

// Subscriber consumes from RabbitMQ: Config.Concurrency watermill-amqp
// subscriptions per Subscribe call, merged into one channel, with a delayed
// nack; or, with Config.Window > 0, one consumer per Subscribe call with up
// to Window messages in flight (window.go). It is safe for concurrent use.
type Subscriber struct {
	link // its wc is sub's config; the window mode consumes like it
	sub  *wamqp.Subscriber

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
// cfg.DialTimeout passes or ctx ends, see Config.DialTimeout) and returns a
// Subscriber owning that connection. ctx bounds the start-up only, not the
// Subscriber's life. A nil logger logs nothing. An invalid cfg is a
// *framework.ConfigError; giving up on the connection is a *DialError.
func NewSubscriber(ctx context.Context, cfg Config, logger watermill.LoggerAdapter) (*Subscriber, error) {
	l, sub, err := connect(ctx, cfg, logger, "subscriber", wamqp.NewSubscriberWithConnection)
	if err != nil {
		return nil, err
	}
	life, end := context.WithCancel(context.Background())
	return &Subscriber{link: l, sub: sub, life: life, end: end}, nil
}

// Subscribe declares the durable queue named topic (if missing) and starts
// Config.Concurrency consumers on it. The returned channel is closed when ctx
// ends or the Subscriber is closed. Each message must be acked or nacked; a
// nacked message is returned to the queue after Config.NackDelay.
//
// Messages of one Subscribe call are processed up to Concurrency at a time,
// so their order is not kept when Concurrency > 1.
//
// With Config.Window > 0 it starts one consumer instead, which keeps up to
// Window messages in flight (see Config.Window).
func (s *Subscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	if s.life.Err() != nil {
		return nil, errSubscriberClosed
	}
	if err := waitConnected(ctx, s.cfg, s.conn); err != nil {
		return nil, err
	}
	if s.cfg.Window > 0 {
		return s.subscribeWindow(ctx, topic)
	}

	// inCtx ends with ctx or Close, and stops the inner subscriptions if
	// we fail half way.
	inCtx, cancel := s.subscriptionContext(ctx)
	ins := make([]<-chan *message.Message, 0, s.cfg.Concurrency)
	abort := func(err error) (<-chan *message.Message, error) {
		cancel()
		for _, in := range ins {
			drain(in)
		}
		return nil, err
	}
	for i := 0; i < s.cfg.Concurrency; i++ {
		in, err := s.sub.Subscribe(inCtx, topic)
		if err != nil {
			return abort(fmt.Errorf("brokers/amqp: subscribe to %q (consumer %d of %d): %w", topic, i+1, s.cfg.Concurrency, declareError(s.cfg, topic, err)))
		}
		ins = append(ins, in)
	}
	if !s.addForwarders(len(ins)) {
		return abort(errSubscriberClosed)
	}

	out := make(chan *message.Message)
	var wg sync.WaitGroup
	wg.Add(len(ins))
	for _, in := range ins {
		go func() {
			defer s.forwarders.Done()
			defer wg.Done()
			s.forward(inCtx, in, out)
		}()
	}
	go func() {
		wg.Wait()
		cancel()
		close(out)
	}()
	return out, nil
}

var errSubscriberClosed = errors.New("brokers/amqp: subscriber closed")

// subscriptionContext is a subscription's context: it ends with ctx, when
// the Subscriber closes, or when cancel is called, which the subscription
// must do when it ends.
func (s *Subscriber) subscriptionContext(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(s.life, cancel)
	return ctx, func() {
		stop()
		cancel()
	}
}

// addForwarders counts n goroutines Close must wait for, unless Close has
// begun: then it reports false and the subscription must not start.
func (s *Subscriber) addForwarders(n int) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.life.Err() != nil {
		return false
	}
	s.forwarders.Add(n)
	return true
}

// forward hands each message of one inner subscription to out through a
// proxy message, so a nack can be delayed before it reaches watermill-amqp
// (which would nack with requeue at once). It reads in until it is closed:
// watermill-amqp's delivery loop blocks sending on it and only stops
// watching for that when the subscriber closes, so a reader must stay.
func (s *Subscriber) forward(ctx context.Context, in <-chan *message.Message, out chan<- *message.Message) {
	for orig := range in {
		if ctx.Err() != nil {
			orig.Nack()
			continue
		}
		proxy := message.NewMessage(orig.UUID, orig.Payload)
		proxy.Metadata = orig.Metadata
		proxy.SetContext(orig.Context())

		select {
		case out <- proxy:
		case <-ctx.Done():
			orig.Nack()
			continue
		}

		select {
		case <-proxy.Acked():
			orig.Ack()
		case <-proxy.Nacked():
			wait.For(s.cfg.NackDelay, ctx.Done())
			orig.Nack()
		case <-ctx.Done():
			// The subscription ends while the handler still runs: hand the
			// message back unless its proxy was acked already (select
			// picks at random among ready cases, so an ack that raced the
			// stop would otherwise become a needless redelivery). A late
			// ack of the proxy has no effect, and the redelivery is
			// deduplicated by the claim.
			select {
			case <-proxy.Acked():
				orig.Ack()
			default:
				orig.Nack()
			}
		}
	}
}

// drain nacks everything left on in until it is closed.
func drain(in <-chan *message.Message) {
	go func() {
		for m := range in {
			m.Nack()
		}
	}()
}

// SubscribeInitialize declares the durable queue named topic without
// consuming from it, so messages published before the first Subscribe are
// kept.
func (s *Subscriber) SubscribeInitialize(topic string) error {
	if err := waitConnected(context.Background(), s.cfg, s.conn); err != nil {
		return err
	}
	if err := s.sub.SubscribeInitialize(topic); err != nil {
		return fmt.Errorf("brokers/amqp: declare queue %q: %w", topic, declareError(s.cfg, topic, err))
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
		err := s.sub.Close()
		s.forwarders.Wait()
		s.closeErr = errors.Join(err, s.conn.Close())
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
