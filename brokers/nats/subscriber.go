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
)

// pullWait is how long one pull waits for a message before it asks again.
// A pull in progress is never cut short (a message the server sends for it
// after the worker stopped waiting would sit unseen until its ack wait
// ran out), so it also bounds how long ending a subscription waits for
// its workers.
const pullWait = time.Second

// errClosed is returned by Subscribe after Close.
var errClosed = errors.New("brokers/nats: subscriber closed")

// subscriber consumes a topic through a durable JetStream pull consumer
// that ensureConsumer creates, with concurrency workers per Subscribe,
// each holding one message at a time until it is acked or nacked.
//
// It is written on nats.go rather than watermill-nats's Subscriber, whose
// v2.1.3 JetStream mode, read for this adapter, cannot be fixed from
// outside: it closes its output channel while a delivery callback may
// still be sending on it (a data race, and a "send on closed channel"
// panic that would crash a consumer at shutdown). It also lets nats.go ack
// every message its callback returns from unless ManualAck is set (and
// the callback returns without an ack when the subscriber closes: the
// message would be lost), deletes a durable consumer its subscription
// created when that subscription ends (under the other replicas), and
// drops a message it cannot unmarshal without acking or nacking it (a
// redelivery every AckWait, forever), and it has messages pushed into a
// client buffer (see Subscribe for why that matters). The wire format is
// watermill-nats's, so both read each other's messages (see marshaler).
type subscriber struct {
	s      settings
	nc     *natsgo.Conn
	js     natsgo.JetStreamContext
	logger watermill.LoggerAdapter
	codec  marshaler

	mu      sync.Mutex
	closed  bool
	closing chan struct{}
	subs    sync.WaitGroup // one per Subscribe, until its output is closed
}

func newSubscriber(s settings, logger watermill.LoggerAdapter) (*subscriber, error) {
	nc, js, err := dial(s, logger, "subscriber", nil)
	if err != nil {
		return nil, err
	}
	return &subscriber{s: s, nc: nc, js: js, logger: logger, codec: marshaler{subjectPrefix: s.SubjectPrefix},
		closing: make(chan struct{})}, nil
}

// SubscribeInitialize ensures the topic's stream and the durable consumer,
// so messages published from now on are kept for this consumer.
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

// subscription is one Subscribe call: concurrency workers, each with a
// pull subscription bound to the durable consumer.
type subscription struct {
	*subscriber
	ctx     context.Context
	output  chan *message.Message
	fields  watermill.LogFields
	stop    chan struct{} // closed when the subscription ends
	workers sync.WaitGroup
}

// Subscribe ensures the stream and the durable consumer, then starts
// concurrency workers, each pulling one message at a time from the
// consumer (shared by every replica of the service) and holding it until
// the router acks or nacks it. The channel is closed when ctx ends or the
// subscriber closes.
//
// One message per pull, not a pushed stream: JetStream starts a message's
// ack wait when it delivers it, so a message pushed into a client buffer
// behind busy handlers would be redelivered to another replica while its
// first copy still waits, and both would be processed (harmless for a
// claimed effect, but a message that cannot be keyed would be poisoned
// twice). A pulled message is only ever in a worker's hands.
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
		// Bound, never created here: nats.go deletes a consumer its
		// subscription created when the subscription ends.
		ps, err := s.js.PullSubscribe(subject, s.s.Durable, natsgo.Bind(stream, s.s.Durable))
		if err != nil {
			close(sub.stop)
			sub.end(pulls)
			return nil, fmt.Errorf("brokers/nats: subscribe to %q (consumer %q on stream %q): %w", subject, s.s.Durable, stream, err)
		}
		pulls = append(pulls, ps)
	}
	for _, ps := range pulls {
		sub.workers.Add(1)
		go sub.work(ps)
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

// end waits for the workers (each finishes its pull, at most pullWait,
// and hands back the message it holds, see handle), ends the pull
// subscriptions and closes the output channel, once no worker can send on
// it any more.
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

// work pulls one message at a time and handles it, until the
// subscription ends.
func (sub *subscription) work(ps *natsgo.Subscription) {
	defer sub.workers.Done()
	backoff := dialBackoffLo
	for {
		select {
		case <-sub.stop:
			return
		default:
		}
		msgs, err := ps.Fetch(1, natsgo.MaxWait(pullWait))
		for _, m := range msgs {
			sub.handle(m) // hands it back if the subscription ended meanwhile
		}
		switch {
		case err == nil, errors.Is(err, context.DeadlineExceeded), errors.Is(err, natsgo.ErrTimeout):
			backoff = dialBackoffLo
		default:
			// Disconnected (nats.go reconnects by itself), or the
			// consumer was deleted: try again, slower and slower.
			sub.logger.Debug("NATS pull failed, retrying", watermill.LogFields{"err": err.Error(), "retry_in": backoff.String()}.Add(sub.fields))
			select {
			case <-sub.stop:
				return
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, dialBackoffHi)
		}
	}
}

// handle gives one message to the router and settles it. While the router
// works on it, handle tells JetStream it is in progress every half ack
// wait, so ack_wait bounds how long a dead consumer's messages wait for
// redelivery, not how long a handler may take. It returns once the
// message is acked (AckSync: the server confirmed), nacked
// (NakWithDelay), or handed back because the subscription ends.
func (sub *subscription) handle(m *natsgo.Msg) {
	msg, _ := sub.codec.Unmarshal(m) // never fails
	ctx, cancel := context.WithCancel(sub.ctx)
	defer cancel()
	msg.SetContext(ctx)
	fields := sub.fields.Add(watermill.LogFields{"message_uuid": msg.UUID, "delivered": msg.Metadata.Get(metaDelivered)})

	progress := time.NewTicker(max(sub.s.AckWait/2, 500*time.Millisecond))
	defer progress.Stop()
	for sent := false; !sent; {
		select {
		case sub.output <- msg:
			sent = true
		case <-progress.C:
			sub.inProgress(m, fields)
		case <-sub.stop:
			sub.handBack(m, fields)
			return
		}
	}
	for {
		select {
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
			// message must not be handed back (it would come again as a
			// duplicate).
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
		// JetStream redelivers it after AckWait; the claim makes that
		// copy a duplicate.
		sub.logger.Error("NATS ack failed; the message will be redelivered", err, fields)
	}
}

func (sub *subscription) nack(m *natsgo.Msg, fields watermill.LogFields) {
	var err error
	if sub.s.NackDelay > 0 {
		err = m.NakWithDelay(sub.s.NackDelay)
	} else {
		err = m.Nak()
	}
	if err != nil {
		sub.logger.Error("NATS nak failed; the message will be redelivered after AckWait", err, fields)
	}
}

// handBack naks a message the subscription will not process, without
// delay: it is not failing, this subscription is ending.
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

// Close ends every subscription (see subscription.end) and closes the
// connection.
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

// IsConnected reports whether the NATS connection is up right now, for
// the consumer's /healthz (observe.SubscriberConnected).
func (s *subscriber) IsConnected() bool {
	return s.nc.IsConnected()
}
