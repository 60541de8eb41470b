package dlq

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/claimtx/claimtx/brokers"
	_ "github.com/claimtx/claimtx/brokers/amqp" // registers the kind
	"github.com/claimtx/claimtx/internal/amqpheader"
	"github.com/claimtx/claimtx/internal/poison"
)

// Defaults for a brokers.AMQPConfig not made by brokers.LoadConfig.
const (
	defaultAMQPURL     = "amqp://guest:guest@127.0.0.1:5672/" //nolint:gosec // RabbitMQ's stock local account, not a secret
	defaultDialTimeout = 30 * time.Second
)

// amqpSource browses a queue with basic.get and republishes on a
// confirm-mode channel. Browsed messages stay unacked, hidden from other
// consumers, until the channel closes (or the process dies) and requeues
// them in place. A quorum queue's x-delivery-limit may count that requeue
// as a delivery: poison queues must have none. The browse stops at the
// count of ready messages at the opening.
type amqpSource struct {
	conn    *amqp091.Connection
	get     *amqp091.Channel // basic.get; holds the unacked messages
	pub     *amqp091.Channel // confirm mode
	queue   string
	total   int64
	read    int64
	targets map[string]error
}

func openAMQP(_ context.Context, cfg brokers.AMQPConfig, o Options) (_ *amqpSource, err error) {
	url := cmp.Or(cfg.URL, defaultAMQPURL)
	conn, err := amqp091.DialConfig(url, amqp091.Config{
		Dial:       amqp091.DefaultDial(cmp.Or(cfg.DialTimeout, defaultDialTimeout)),
		Properties: amqp091.Table{"connection_name": cmp.Or(cfg.ConnectionName, "claimtx") + " dlq"},
	})
	if err != nil {
		return nil, fmt.Errorf("connect to RabbitMQ: %w", err)
	}
	s := &amqpSource{conn: conn, queue: o.Destination, targets: map[string]error{}}
	defer func() {
		if err != nil {
			_ = s.Close()
		}
	}()
	if s.get, err = conn.Channel(); err != nil {
		return nil, fmt.Errorf("open a channel: %w", err)
	}
	// Passive: never create a queue, with arguments that might be wrong.
	q, err := s.get.QueueDeclarePassive(o.Destination, true, false, false, false, nil)
	if err != nil {
		return nil, queueErr("poison queue", o.Destination, err)
	}
	s.total = int64(q.Messages)
	if s.pub, err = conn.Channel(); err != nil {
		return nil, fmt.Errorf("open a channel: %w", err)
	}
	if err = s.pub.Confirm(false); err != nil {
		return nil, fmt.Errorf("enable publisher confirms: %w", err)
	}
	return s, nil
}

// queueErr names a queue that does not exist.
func queueErr(what, name string, err error) error {
	var ae *amqp091.Error
	if errors.As(err, &ae) && ae.Code == amqp091.NotFound {
		return fmt.Errorf("%s %q does not exist on RabbitMQ (check --topic, --poison-topic and the vhost of AMQP_URL)", what, name)
	}
	return fmt.Errorf("%s %q: %w", what, name, err)
}

func (s *amqpSource) Destination() string { return s.queue }
func (s *amqpSource) Total() int64        { return s.total }

func (s *amqpSource) Next(ctx context.Context, max int) ([]*Letter, error) {
	var out []*Letter
	for len(out) < max && s.read < s.total {
		if err := ctx.Err(); err != nil {
			return out, err
		}
		d, ok, err := s.get.Get(s.queue, false)
		if err != nil {
			return out, fmt.Errorf("read poison queue %q: %w", s.queue, err)
		}
		if !ok {
			// Fewer than counted: someone else took some. Stop here.
			s.total = s.read
			break
		}
		s.read++
		msg := amqpheader.ToMessage(d)
		out = append(out, &Letter{Msg: msg, Position: "#" + strconv.FormatInt(s.read, 10), Stamps: stampsOf(msg.Metadata), raw: &d})
	}
	return page(out)
}

func (s *amqpSource) Settle(ctx context.Context, batch []*Letter, target func(*Letter) string) error {
	return republish(batch, target, func(l *Letter, t string) (func() error, error) {
		if err := checkOnce(s.targets, t, func() error { return s.checkTarget(t) }); err != nil {
			return nil, err
		}
		dc, err := s.pub.PublishWithDeferredConfirmWithContext(ctx, "", t, false, false, republishing(l.raw.(*amqp091.Delivery)))
		if err != nil {
			return nil, fmt.Errorf("republish to %q: %w", t, err)
		}
		return func() error {
			switch ok, err := dc.WaitContext(ctx); {
			case err != nil:
				return fmt.Errorf("await the confirm of %s: %w", l.Position, err)
			case !ok:
				return fmt.Errorf("RabbitMQ refused (nacked) the republished copy of %s", l.Position)
			}
			return nil
		}, nil
	}, func(l *Letter) error {
		if err := l.raw.(*amqp091.Delivery).Ack(false); err != nil {
			return fmt.Errorf("remove %s from the poison queue: %w", l.Position, err)
		}
		return nil
	})
}

// checkTarget makes sure the queue a replay publishes to exists: the
// default exchange silently drops a message routed to no queue, and a
// publisher confirm does not tell. It uses a channel of its own: a failed
// passive declaration closes its channel.
func (s *amqpSource) checkTarget(q string) error {
	ch, err := s.conn.Channel()
	if err != nil {
		return err
	}
	if _, err := ch.QueueDeclarePassive(q, true, false, false, false, nil); err != nil {
		return queueErr("original topic's queue", q, err)
	}
	_ = ch.Close()
	return nil
}

func (s *amqpSource) Close() error {
	var errs []error
	for _, ch := range []*amqp091.Channel{s.get, s.pub} {
		if ch != nil && !ch.IsClosed() {
			errs = append(errs, ch.Close())
		}
	}
	if s.conn != nil && !s.conn.IsClosed() {
		errs = append(errs, s.conn.Close())
	}
	return errors.Join(errs...)
}

// republishing is the copy of d that goes back to its topic: body,
// properties and typed headers (x-death stays an array) without the poison
// bookkeeping, persistent. UserId is dropped: RabbitMQ refuses a user-id
// other than the connection's.
func republishing(d *amqp091.Delivery) amqp091.Publishing {
	headers := make(amqp091.Table, len(d.Headers))
	for k, v := range d.Headers {
		if !poison.IsPoisonKey(k) {
			headers[k] = v
		}
	}
	return amqp091.Publishing{
		Headers:         headers,
		ContentType:     d.ContentType,
		ContentEncoding: d.ContentEncoding,
		DeliveryMode:    amqp091.Persistent,
		Priority:        d.Priority,
		CorrelationId:   d.CorrelationId,
		ReplyTo:         d.ReplyTo,
		Expiration:      d.Expiration,
		MessageId:       d.MessageId,
		Timestamp:       d.Timestamp,
		Type:            d.Type,
		AppId:           d.AppId,
		Body:            d.Body,
	}
}
