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

type publisher struct {
	link
	pub *wamqp.Publisher

	declaredMu sync.Mutex
	declared   map[string]bool
	close      func() error // sync.OnceValue
}

var _ message.Publisher = (*publisher)(nil)

// NewPublisher validates cfg and connects as NewSubscriber does (with the
// same errors), then opens the confirm-mode channel pool. The publisher
// publishes to the default exchange with routing key = topic, declaring the
// queue first, and returns once RabbitMQ confirmed every message; it is
// safe for concurrent use.
func NewPublisher(ctx context.Context, cfg brokers.AMQPConfig, logger watermill.LoggerAdapter) (message.Publisher, error) {
	l, err := connect(ctx, cfg, logger)
	if err != nil {
		return nil, err
	}
	pub, err := wamqp.NewPublisherWithConnection(l.wc, l.logger, l.conn.ConnectionWrapper)
	if err != nil {
		_ = l.conn.Close()
		return nil, fmt.Errorf("brokers/amqp: create publisher: %w", err)
	}
	return &publisher{link: l, pub: pub, declared: make(map[string]bool),
		close: sync.OnceValue(func() error { return errors.Join(pub.Close(), l.conn.Close()) })}, nil
}

// Publish sends messages to the queue named topic and waits for RabbitMQ's
// confirms; it fails while the connection is re-established (retry). A
// framework.Permanent error refuses what can never pass: properties and
// headers over one frame (checkFrameSize), a queue the user may not
// declare or an exchange it may not write (ACCESS_REFUSED), a body over
// max_message_size (PRECONDITION_FAILED).
func (p *publisher) Publish(topic string, messages ...*message.Message) error {
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
// for a passing reason: watermill-amqp reports only "delivery not
// confirmed", and the limit cannot be asked for. So a message with a body
// as long as the longest that failed goes to the default exchange with a
// routing key no queue has: dropped when it may be written, a channel
// closed with ACCESS_REFUSED or PRECONDITION_FAILED when not (then
// returned). It is bounded by writeProbeWait whatever the connection does
// (a half-open one can hold a channel.open for a heartbeat timeout).
func (p *publisher) probeWrite(size int) error {
	verdict := make(chan error, 1) // buffered: a late probe exits on its own
	go func() { verdict <- p.writeRefused(size) }()
	select {
	case err := <-verdict:
		return err
	case <-time.After(writeProbeWait):
		return nil
	}
}

// writeProbeWait bounds probeWrite; a healthy probe takes milliseconds.
const writeProbeWait = 5 * time.Second

func largestBody(messages []*message.Message) int {
	n := 0
	for _, m := range messages {
		n = max(n, len(m.Payload))
	}
	return n
}

// writeRefused is the probe itself, unbounded.
func (p *publisher) writeRefused(size int) error {
	ch, err := p.channel()
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
	// Not confirmed: the closed channel says why.
	select {
	case cerr := <-closed:
		if cerr != nil && (cerr.Code == amqp091.AccessRefused || cerr.Code == amqp091.PreconditionFailed) {
			return cerr
		}
	case <-time.After(time.Second):
	}
	return nil
}

func (p *publisher) checkFrames(messages []*message.Message) error {
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

func (p *publisher) declare(topic string) error {
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
		if accessRefused(err) {
			// Never publishable: a poison copy goes to its fallback.
			err = framework.Permanent(err)
		}
		return fmt.Errorf("brokers/amqp: declare queue %q: %w", topic, err)
	}
	p.declared[topic] = true
	return nil
}

// Close closes the channel pool and the connection. It is idempotent.
func (p *publisher) Close() error { return p.close() }
