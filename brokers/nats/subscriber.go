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

// stopTimeout bounds how long ending a subscription waits for the server
// to confirm it sends no more and for the messages already received to be
// handed back.
const stopTimeout = 10 * time.Second

// errClosed is returned by Subscribe after Close.
var errClosed = errors.New("brokers/nats: subscriber closed")

// subscriber consumes a topic through a durable JetStream push consumer
// that ensureConsumer creates, with concurrency queue subscriptions per
// Subscribe, each holding one message at a time until it is acked or
// nacked.
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
// redelivery every AckWait, forever). The wire format is
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
	nc, err := dial(s, logger, "subscriber")
	if err != nil {
		return nil, err
	}
	js, err := nc.JetStream()
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("brokers/nats: JetStream context: %w", err)
	}
	return &subscriber{s: s, nc: nc, js: js, logger: logger, codec: marshaler{subjectPrefix: s.subjectPrefix},
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

// subscription is one Subscribe call.
type subscription struct {
	*subscriber
	ctx    context.Context
	output chan *message.Message
	fields watermill.LogFields

	mu       sync.Mutex
	stopped  bool
	stop     chan struct{} // closed when the subscription ends
	inflight sync.WaitGroup
}

// Subscribe ensures the stream and the durable consumer, then binds
// concurrency queue subscriptions to the consumer (its deliver group is
// the durable name, shared by every replica) and merges them into one
// channel. The channel is closed when ctx ends or the subscriber closes.
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
		fields: watermill.LogFields{"topic": topic, "subject": subject, "stream": stream, "durable": s.s.durable}}
	nsubs := make([]*natsgo.Subscription, 0, s.s.concurrency)
	for range s.s.concurrency {
		ns, err := s.js.QueueSubscribe(subject, s.s.durable, sub.handle,
			natsgo.Bind(stream, s.s.durable), natsgo.ManualAck())
		if err != nil {
			sub.end(nsubs)
			return nil, fmt.Errorf("brokers/nats: subscribe to %q (consumer %q on stream %q): %w", subject, s.s.durable, stream, err)
		}
		nsubs = append(nsubs, ns)
	}
	go func() {
		select {
		case <-ctx.Done():
		case <-s.closing:
		}
		sub.end(nsubs)
	}()
	return sub.output, nil
}

// end stops the subscription: the server stops sending (Drain sends the
// unsubscribe first), every message received and not acked or nacked is
// nacked without delay, so another subscription (or replica) takes it at
// once instead of after AckWait; then the output channel is closed, once
// no delivery callback can send on it any more.
func (sub *subscription) end(nsubs []*natsgo.Subscription) {
	defer sub.subs.Done()
	closed := make([]<-chan natsgo.SubStatus, 0, len(nsubs))
	for _, ns := range nsubs {
		closed = append(closed, ns.StatusChanged(natsgo.SubscriptionClosed))
		if err := ns.Drain(); err != nil && !errors.Is(err, natsgo.ErrConnectionClosed) {
			sub.logger.Error("NATS subscription did not drain", err, sub.fields)
		}
	}
	sub.mu.Lock()
	sub.stopped = true
	close(sub.stop)
	sub.mu.Unlock()
	deadline := time.NewTimer(stopTimeout)
	defer deadline.Stop()
	for i, ch := range closed {
		select {
		case <-ch:
		case <-deadline.C:
			_ = nsubs[i].Unsubscribe()
		}
	}
	sub.inflight.Wait()
	close(sub.output)
}

// handle is the delivery callback of every queue subscription; each runs
// one message at a time, so concurrency subscriptions hold up to
// concurrency messages. While the router works on the message, handle
// tells JetStream it is in progress every half AckWait, so AckWait bounds
// how long a dead consumer's messages wait for redelivery, not how long a
// handler may take. It returns once the message is acked (AckSync: the
// server confirmed), nacked (NakWithDelay), or handed back because the
// subscription ends.
func (sub *subscription) handle(m *natsgo.Msg) {
	sub.mu.Lock()
	if sub.stopped {
		sub.mu.Unlock()
		sub.handBack(m, nil)
		return
	}
	sub.inflight.Add(1)
	sub.mu.Unlock()
	defer sub.inflight.Done()

	msg, _ := sub.codec.Unmarshal(m) // never fails
	ctx, cancel := context.WithCancel(sub.ctx)
	defer cancel()
	msg.SetContext(ctx)
	fields := sub.fields.Add(watermill.LogFields{"message_uuid": msg.UUID, "delivered": msg.Metadata.Get(metaDelivered)})

	progress := time.NewTicker(max(sub.s.ackWait/2, 500*time.Millisecond))
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
	if sub.s.nackDelay > 0 {
		err = m.NakWithDelay(sub.s.nackDelay)
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
