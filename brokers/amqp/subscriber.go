package amqp

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
)

// Subscriber consumes from RabbitMQ: Config.Concurrency consumers per
// Subscribe call, each settling one message before it takes the next,
// merged into one channel, with a delayed nack; or, with Config.Window > 0,
// one consumer per Subscribe call with up to Window messages in flight
// (consumer.go). It is safe for concurrent use.
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
// cfg.DialTimeout passes or ctx ends, see Config.DialTimeout) and returns a
// Subscriber owning that connection. ctx bounds the start-up only, not the
// Subscriber's life. A nil logger logs nothing. An invalid cfg is a
// *framework.ConfigError; giving up on the connection is a *DialError.
func NewSubscriber(ctx context.Context, cfg Config, logger watermill.LoggerAdapter) (*Subscriber, error) {
	l, err := connect(ctx, cfg, logger)
	if err != nil {
		return nil, err
	}
	life, end := context.WithCancel(context.Background())
	return &Subscriber{link: l, life: life, end: end}, nil
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
