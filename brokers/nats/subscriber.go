package nats

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	natsgo "github.com/nats-io/nats.go"

	"github.com/claimtx/claimtx/brokers"
	"github.com/claimtx/claimtx/brokers/internal/wait"
	"github.com/claimtx/claimtx/internal/natsmsg"
)

// pullWait is how long one pull waits for a message. A pull is never cut
// short (a message sent for it afterwards would sit unseen until its ack
// wait ran out), so it also bounds how long ending a subscription takes.
const pullWait = time.Second

var errClosed = errors.New("brokers/nats: subscriber closed")

// subscriber consumes a topic through the durable pull consumer
// ensureConsumer creates, with concurrency workers per Subscribe, each
// holding one message until it is acked or nacked. It is written on nats.go
// because watermill-nats v2.1.3's subscriber cannot be fixed from outside
// (docs/adapters.md, "Read the library you wrap"): above all it closes its
// output channel while a callback may still send on it, a panic at
// shutdown.
type subscriber struct {
	s      settings
	nc     *natsgo.Conn
	js     natsgo.JetStreamContext
	logger watermill.LoggerAdapter

	mu      sync.Mutex
	closed  bool
	closing chan struct{}
	subs    sync.WaitGroup // one per Subscribe, until its output is closed
}

func newSubscriber(ctx context.Context, s settings, logger watermill.LoggerAdapter) (*subscriber, error) {
	nc, js, err := dial(ctx, s, logger, "subscriber", nil)
	if err != nil {
		return nil, err
	}
	return &subscriber{s: s, nc: nc, js: js, logger: logger, closing: make(chan struct{})}, nil
}

// SubscribeInitialize ensures the topic's stream and the durable consumer.
func (s *subscriber) SubscribeInitialize(topic string) error {
	_, _, err := s.ensure(topic)
	return err
}

func (s *subscriber) ensure(topic string) (subject, stream string, err error) {
	if subject, err = s.s.subject(topic); err != nil {
		return "", "", err
	}
	if stream, err = ensureStream(s.js, s.s, subject); err != nil {
		return "", "", err
	}
	return subject, stream, ensureConsumer(s.js, s.s, stream, subject)
}

// subscription is one Subscribe call.
type subscription struct {
	*subscriber
	ctx     context.Context
	output  chan *message.Message
	fields  watermill.LogFields
	stop    chan struct{} // closed when the subscription ends
	workers sync.WaitGroup
}

// Subscribe ensures the stream and the durable consumer, then starts the
// workers; the channel is closed when ctx ends or the subscriber closes.
// One message per pull, not a pushed stream: JetStream starts the ack wait
// on delivery, so a message pushed into a client buffer behind busy
// handlers would be redelivered beside itself (a message that cannot be
// keyed poisoned twice).
func (s *subscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	subject, stream, err := s.ensure(topic)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, errClosed
	}
	s.subs.Add(1)
	s.mu.Unlock()
	sub := &subscription{subscriber: s, ctx: ctx, output: make(chan *message.Message), stop: make(chan struct{}),
		fields: watermill.LogFields{"topic": topic, "subject": subject, "stream": stream, "durable": s.s.Durable}}
	pulls := make([]*natsgo.Subscription, 0, s.s.Concurrency)
	for range s.s.Concurrency {
		// Bound, never created here (see ensureConsumer).
		ps, err := s.js.PullSubscribe(subject, s.s.Durable, natsgo.Bind(stream, s.s.Durable))
		if err != nil {
			close(sub.stop)
			sub.end(pulls)
			return nil, fmt.Errorf("brokers/nats: subscribe to %q (consumer %q on stream %q): %w", subject, s.s.Durable, stream, err)
		}
		pulls = append(pulls, ps)
	}
	for _, ps := range pulls {
		sub.workers.Go(func() { sub.work(ps) })
	}
	go func() {
		select {
		case <-ctx.Done():
		case <-s.closing:
		}
		close(sub.stop)
		sub.end(pulls)
	}()
	return sub.output, nil
}

// end waits for the workers (at most pullWait), ends the pull
// subscriptions and closes the output channel, which no worker can send on
// any more.
func (sub *subscription) end(pulls []*natsgo.Subscription) {
	defer sub.subs.Done()
	sub.workers.Wait()
	for _, ps := range pulls {
		if err := ps.Unsubscribe(); err != nil && !errors.Is(err, natsgo.ErrConnectionClosed) && !errors.Is(err, natsgo.ErrBadSubscription) {
			sub.logger.Debug("NATS pull subscription did not end cleanly", watermill.LogFields{"err": err.Error()}.Add(sub.fields))
		}
	}
	close(sub.output)
}

func (sub *subscription) work(ps *natsgo.Subscription) {
	backoff := dialBackoffLo
	for {
		select {
		case <-sub.stop:
			return
		default:
		}
		msgs, err := ps.Fetch(1, natsgo.MaxWait(pullWait))
		for _, m := range msgs {
			sub.handle(m)
		}
		switch {
		case err == nil, errors.Is(err, context.DeadlineExceeded), errors.Is(err, natsgo.ErrTimeout):
			backoff = dialBackoffLo
		default:
			// Disconnected (nats.go reconnects) or the consumer deleted.
			sub.logger.Debug("NATS pull failed, retrying", watermill.LogFields{"err": err.Error(), "retry_in": backoff.String()}.Add(sub.fields))
			if !wait.For(backoff, sub.stop) {
				return
			}
			backoff = min(2*backoff, dialBackoffHi)
		}
	}
}

// handle gives one message to the router and settles it, signalling
// in-progress every half ack wait meanwhile, so ack_wait bounds how long a
// dead consumer's messages wait, not a handler. A message still held when
// the subscription ends is handed back.
func (sub *subscription) handle(m *natsgo.Msg) {
	msg, _ := marshaler{}.Unmarshal(m) // never fails
	ctx, cancel := context.WithCancel(sub.ctx)
	defer cancel()
	msg.SetContext(ctx)
	fields := sub.fields.Add(watermill.LogFields{"message_uuid": msg.UUID, "delivered": msg.Metadata.Get(natsmsg.MetaDelivered)})

	progress := time.NewTicker(max(sub.s.AckWait/2, 500*time.Millisecond))
	defer progress.Stop()
	out := sub.output // nil once sent
	for {
		select {
		case out <- msg:
			out = nil
		case <-msg.Acked():
			sub.ack(m, fields)
			return
		case <-msg.Nacked():
			sub.nack(m, fields)
			return
		case <-progress.C:
			sub.inProgress(m, fields)
		case <-sub.stop:
			// An ack or nack that came with the stop wins: a committed
			// message handed back would come again.
			select {
			case <-msg.Acked():
				sub.ack(m, fields)
			case <-msg.Nacked():
				sub.nack(m, fields)
			default:
				sub.handBack(m, fields)
			}
			return
		}
	}
}

func (sub *subscription) ack(m *natsgo.Msg, fields watermill.LogFields) {
	if err := m.AckSync(); err != nil {
		sub.logger.Error("NATS ack failed; the message will be redelivered", err, fields)
	}
}

func (sub *subscription) nack(m *natsgo.Msg, fields watermill.LogFields) {
	if err := m.NakWithDelay(sub.s.NackDelay); err != nil { // a plain Nak when the delay is 0
		sub.logger.Error("NATS nak failed; the message will be redelivered after AckWait", err, fields)
	}
}

// handBack naks without delay a message this ending subscription will not
// process.
func (sub *subscription) handBack(m *natsgo.Msg, fields watermill.LogFields) {
	if err := m.Nak(); err != nil && !errors.Is(err, natsgo.ErrConnectionClosed) {
		sub.logger.Debug("NATS nak at shutdown failed; the message will be redelivered after AckWait", watermill.LogFields{"err": err.Error()}.Add(fields))
	}
}

func (sub *subscription) inProgress(m *natsgo.Msg, fields watermill.LogFields) {
	if err := m.InProgress(); err != nil {
		sub.logger.Debug("NATS in-progress signal failed", watermill.LogFields{"err": err.Error()}.Add(fields))
	}
}

// Close ends every subscription and closes the connection.
func (s *subscriber) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	close(s.closing)
	s.mu.Unlock()
	s.subs.Wait()
	s.nc.Close()
	return nil
}

// IsConnected reports whether the NATS connection is up, for /healthz.
func (s *subscriber) IsConnected() bool {
	return s.nc.IsConnected()
}

// ReplayHorizon reports how old a message of topic can be when JetStream
// still delivers it: its stream's max_age, else brokers.UnboundedHorizon
// (also for a subject streams: create has no stream for yet). Count and
// size limits only remove messages sooner. A consumer compares it with its
// claim retention.
func (s *subscriber) ReplayHorizon(ctx context.Context, topic string) (time.Duration, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	subject, err := s.s.subject(topic)
	if err != nil {
		return 0, err
	}
	name, err := s.js.StreamNameBySubject(subject, natsgo.Context(ctx))
	if errors.Is(err, natsgo.ErrNoMatchingStream) && s.s.Streams != streamsRequire {
		return brokers.UnboundedHorizon, nil
	}
	if err != nil {
		return 0, fmt.Errorf("brokers/nats: replay horizon of %q: look up the stream of subject %q: %w", topic, subject, err)
	}
	info, err := s.js.StreamInfo(name, natsgo.Context(ctx))
	if err != nil {
		return 0, fmt.Errorf("brokers/nats: replay horizon of %q: stream %q: %w", topic, name, err)
	}
	if info.Config.MaxAge <= 0 {
		return brokers.UnboundedHorizon, nil
	}
	return info.Config.MaxAge, nil
}
