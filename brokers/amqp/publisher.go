package amqp

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/claimtx/claimtx/brokers"
	"github.com/claimtx/claimtx/framework"
)

// Publisher publishes to the default exchange with routing key = topic, with
// publisher confirms: Publish returns nil only after RabbitMQ confirmed every
// message. Before the first publish to a topic it declares the durable queue
// named topic, because RabbitMQ silently drops a message routed to a queue
// that does not exist yet. It is safe for concurrent use.
type Publisher struct {
	link
	pub *wamqp.Publisher

	declaredMu sync.Mutex
	declared   map[string]bool

	closeOnce sync.Once
	closeErr  error
}

var _ message.Publisher = (*Publisher)(nil)

// NewPublisher validates cfg, connects (retrying like NewSubscriber, until
// cfg.DialTimeout passes or ctx ends) and opens the confirm-mode channel
// pool. A nil logger logs nothing. An invalid cfg is a
// *framework.ConfigError; giving up on the connection is a *DialError.
func NewPublisher(ctx context.Context, cfg brokers.AMQPConfig, logger watermill.LoggerAdapter) (*Publisher, error) {
	l, err := connect(ctx, cfg, logger)
	if err != nil {
		return nil, err
	}
	pub, err := wamqp.NewPublisherWithConnection(l.wc, l.logger, l.conn.ConnectionWrapper)
	if err != nil {
		_ = l.conn.Close()
		return nil, fmt.Errorf("brokers/amqp: create publisher: %w", err)
	}
	return &Publisher{link: l, pub: pub, declared: make(map[string]bool)}, nil
}

// Publish sends messages to the queue named topic and waits for RabbitMQ's
// confirms. It fails (and the caller should retry) while the connection is
// being re-established. A message whose properties and headers do not fit
// in one frame (frame_max, 128 KiB by default) is refused before anything
// is sent, with a framework.Permanent error: RabbitMQ would close the
// connection over it. So is a topic whose queue the user may not declare,
// a publish the user may not make (no write permission on the default
// exchange): both ACCESS_REFUSED, and a message longer than the broker's
// max_message_size (PRECONDITION_FAILED).
func (p *Publisher) Publish(topic string, messages ...*message.Message) error {
	if err := p.declare(topic); err != nil {
		return err
	}
	if err := p.checkFrames(messages); err != nil {
		return fmt.Errorf("brokers/amqp: publish to %q: %w", topic, err)
	}
	if err := p.pub.Publish(topic, messages...); err != nil {
		if refused := p.probeWrite(largestBody(messages)); refused != nil {
			err = framework.Permanent(errors.Join(err, refused))
		}
		return fmt.Errorf("brokers/amqp: publish to %q: %w", topic, err)
	}
	return nil
}

// probeWrite tells a publish RabbitMQ will never take from one that failed
// for a passing reason. RabbitMQ refuses a publish without write
// permission on the exchange (ACCESS_REFUSED) and a body longer than its
// max_message_size (PRECONDITION_FAILED) by closing the channel, and
// watermill-amqp reports only "delivery not confirmed"; the client cannot
// ask for the limit. So, after a failed publish, one message with a body
// as long as the longest that failed goes to the default exchange with a
// routing key no queue has: dropped when it may be written there, a
// channel closed with one of those two codes when not. nil unless that is
// the answer.
//
// The probe is bounded by writeProbeWait whatever the connection does (a
// half-open one can hold a channel.open for a heartbeat timeout): a
// failed publish, a poison copy's during a drain above all, must not wait
// longer for its verdict than the publish itself took to fail.
func (p *Publisher) probeWrite(size int) error {
	verdict := make(chan error, 1) // buffered: a late probe exits on its own
	go func() { verdict <- p.writeRefused(size) }()
	select {
	case err := <-verdict:
		return err
	case <-time.After(writeProbeWait):
		return nil
	}
}

// writeProbeWait bounds probeWrite: a probe on a healthy connection is
// confirmed in milliseconds.
const writeProbeWait = 5 * time.Second

// largestBody is the length of the longest payload among messages.
func largestBody(messages []*message.Message) int {
	n := 0
	for _, m := range messages {
		n = max(n, len(m.Payload))
	}
	return n
}

// writeRefused is the probe itself, unbounded.
func (p *Publisher) writeRefused(size int) error {
	ac := p.conn.Connection()
	if ac == nil || ac.IsClosed() {
		return nil
	}
	ch, err := ac.Channel()
	if err != nil {
		return nil
	}
	defer func() { _ = ch.Close() }()
	closed := ch.NotifyClose(make(chan *amqp091.Error, 1))
	if err := ch.Confirm(false); err != nil {
		return nil
	}
	dc, err := ch.PublishWithDeferredConfirm("", "claimtx-write-probe.no-such-queue", false, false, amqp091.Publishing{Body: make([]byte, size)})
	if err != nil {
		return nil
	}
	select {
	case <-dc.Done():
		if dc.Acked() {
			return nil // the user may write: the failure was a passing one
		}
	case <-time.After(writeProbeWait):
		return nil
	}
	// Not confirmed: a closed channel says why. It closes with the nack
	// (amqp091 nacks what is pending when a channel shuts down).
	select {
	case cerr := <-closed:
		if cerr != nil && (cerr.Code == amqp091.AccessRefused || cerr.Code == amqp091.PreconditionFailed) {
			return cerr
		}
	case <-time.After(time.Second):
	}
	return nil
}

// checkFrames refuses the messages when one's content header frame is
// longer than the connection's negotiated frame size (checkFrameSize).
func (p *Publisher) checkFrames(messages []*message.Message) error {
	ac := p.conn.Connection()
	if ac == nil {
		return nil
	}
	frameMax := ac.Config.FrameSize // negotiated when the connection opened
	for _, m := range messages {
		pub, err := p.wc.Marshaler.Marshal(m)
		if err != nil {
			return nil // watermill-amqp's Publish reports it
		}
		if err := checkFrameSize(pub, frameMax, m.UUID); err != nil {
			return err
		}
	}
	return nil
}

func (p *Publisher) declare(topic string) error {
	p.declaredMu.Lock()
	defer p.declaredMu.Unlock()
	if p.declared[topic] {
		return nil
	}
	if p.conn.Closed() {
		return errors.New("brokers/amqp: publisher closed")
	}
	if !p.conn.IsConnected() {
		return errors.New("brokers/amqp: not connected to RabbitMQ")
	}
	if err := p.declareQueue(topic); err != nil {
		if aerr := (*amqp091.Error)(nil); errors.As(err, &aerr) && aerr.Code == amqp091.AccessRefused {
			// The user may not declare (configure) this queue: waiting
			// does not change that, so no message published here can
			// ever be sent (a poison copy then goes to its fallback
			// instead of being redelivered forever).
			err = framework.Permanent(err)
		}
		return fmt.Errorf("brokers/amqp: declare queue %q: %w", topic, err)
	}
	p.declared[topic] = true
	return nil
}

// Close closes the channel pool and the connection. It is idempotent.
func (p *Publisher) Close() error {
	p.closeOnce.Do(func() {
		p.closeErr = errors.Join(p.pub.Close(), p.conn.Close())
	})
	return p.closeErr
}
