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
		if refused := p.probeWrite(messages); refused != nil {
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
func (p *publisher) probeWrite(messages []*message.Message) error {
	size := 0
	for _, m := range messages {
		size = max(size, len(m.Payload))
	}
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

// frameOverhead is what a frame adds to its payload: type, channel, size
// and the frame-end octet.
const frameOverhead = 8

// checkFrameSize refuses, as a framework.Permanent error, a message whose
// properties do not fit in one frame of frameMax bytes (0: no limit). The
// body may span frames, but all properties travel in one header frame, and
// one over frame_max makes RabbitMQ close the whole connection, failing
// every publish on it, again on each retry. Refused here it fails alone.
func checkFrameSize(p amqp091.Publishing, frameMax int, uuid string) error {
	if frameMax <= 0 {
		return nil
	}
	if n := headerFrameSize(p); n > frameMax-frameOverhead {
		return framework.Permanent(fmt.Errorf(
			"brokers/amqp: the properties and headers of message %s take %d bytes, more than a frame holds (frame_max %d): RabbitMQ would close the connection (FRAME_ERROR frame_too_large)",
			uuid, n, frameMax))
	}
	return nil
}

// headerFrameSize is the payload length of the content header frame amqp091
// writes for p: class, weight, body size, property flags, then each
// property set.
func headerFrameSize(p amqp091.Publishing) int {
	n := 2 + 2 + 8 + 2
	for _, s := range []string{p.ContentType, p.ContentEncoding, p.CorrelationId, p.ReplyTo, p.Expiration, p.MessageId, p.Type, p.UserId, p.AppId} {
		if s != "" {
			n += shortstrSize(s)
		}
	}
	if len(p.Headers) > 0 {
		n += 4 + tableSize(p.Headers)
	}
	if p.DeliveryMode > 0 {
		n++
	}
	if p.Priority > 0 {
		n++
	}
	if !p.Timestamp.IsZero() {
		n += 8
	}
	return n
}

// shortstrSize is what amqp091's writeShortstr writes (len mod 256 bytes).
func shortstrSize(s string) int { return 1 + int(uint8(len(s))) }

// tableSize is the length of a table's entries, without their 4-byte length.
func tableSize(t amqp091.Table) int {
	n := 0
	for k, v := range t {
		n += shortstrSize(k) + fieldSize(v)
	}
	return n
}

// fieldSize mirrors amqp091's writeField; a type it cannot write counts 0,
// as the publish fails on it anyway.
func fieldSize(v any) int {
	switch v := v.(type) {
	case bool, byte, int8:
		return 2
	case int16:
		return 3
	case int, int32, float32:
		return 5
	case int64, float64, time.Time:
		return 9
	case amqp091.Decimal:
		return 6
	case string:
		return 5 + len(v)
	case []byte:
		return 5 + len(v)
	case []any:
		n := 5
		for _, e := range v {
			n += fieldSize(e)
		}
		return n
	case amqp091.Table:
		return 1 + 4 + tableSize(v)
	case nil:
		return 1
	}
	return 0
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
