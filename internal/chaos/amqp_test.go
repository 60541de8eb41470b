package chaos

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"sync"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/claimtx/claimtx/internal/testenv"
)

// amqpOps publishes like a plain amqp091 producer (default exchange,
// routing key = queue name, an event_id header) and redials whenever its
// connection was closed, which the chaos run does to everyone at once.
type amqpOps struct {
	url, topic string
	queueType  string // "classic" or "quorum", as the consumers' AMQP_QUEUE_TYPE
	keep       bool   // keep the queues at the end
	// connName is the connection_name of this run's connections: the
	// consumers' (their CONFIG_FILE sets it) and, with " runner", this
	// runner's.
	connName string
	// closeOwn limits the disruption to this run's connections (by name)
	// instead of every connection on the server.
	closeOwn bool

	mu   sync.Mutex
	conn *amqp.Connection
}

func (a *amqpOps) name() string { return "amqp" }

func (a *amqpOps) connection() (*amqp.Connection, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.conn != nil && !a.conn.IsClosed() {
		return a.conn, nil
	}
	conn, err := amqp.DialConfig(a.url, amqp.Config{Properties: amqp.Table{"connection_name": a.connName + " runner"}})
	if err != nil {
		return nil, fmt.Errorf("dial RabbitMQ: %w", err)
	}
	a.conn = conn
	return conn, nil
}

func (a *amqpOps) channel() (*amqp.Channel, error) {
	conn, err := a.connection()
	if err != nil {
		return nil, err
	}
	return conn.Channel()
}

func (a *amqpOps) prepare(context.Context) error {
	ch, err := a.channel()
	if err != nil {
		return err
	}
	defer func() { _ = ch.Close() }()
	// Declared before the consumers start so nothing published first is
	// dropped; the same arguments as the consumer's own declaration
	// (brokers/amqp declares no x-queue-type for a classic queue).
	var args amqp.Table
	if a.queueType == "quorum" {
		args = amqp.Table{"x-queue-type": "quorum"}
	}
	_, err = ch.QueueDeclare(a.topic, true, false, false, false, args)
	return err
}

// publish sends ds with publisher confirms. A batch that fails (the
// connection was closed under it) is sent again whole, as a real producer
// retrying unconfirmed messages would: more duplicates, which is fine.
// It returns how many deliveries it sent in total.
func (a *amqpOps) publish(ctx context.Context, ds []delivery) (int, error) {
	return publishRetrying(ctx, "RabbitMQ", func() (int, error) { return a.publishOnce(ctx, ds) })
}

func (a *amqpOps) publishOnce(ctx context.Context, ds []delivery) (int, error) {
	ch, err := a.channel()
	if err != nil {
		return 0, err
	}
	defer func() { _ = ch.Close() }()
	if err := ch.Confirm(false); err != nil {
		return 0, err
	}
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation, len(ds)))
	for i, d := range ds {
		err := ch.PublishWithContext(ctx, "", a.topic, false, false, amqp.Publishing{
			ContentType:  "application/json",
			DeliveryMode: amqp.Persistent,
			MessageId:    d.brokerID,
			Headers:      amqp.Table{"event_id": d.eventID},
			Body:         d.payload,
		})
		if err != nil {
			return i, err
		}
	}
	for range ds {
		select {
		case c, ok := <-confirms:
			if !ok {
				return len(ds), errors.New("channel closed before every publish was confirmed")
			}
			if !c.Ack {
				return len(ds), fmt.Errorf("RabbitMQ nacked publish %d", c.DeliveryTag)
			}
		case <-ctx.Done():
			return len(ds), ctx.Err()
		}
	}
	return len(ds), nil
}

// depth returns the ready messages of a queue (0, false when it does not
// exist yet).
func (a *amqpOps) depth(name string) (int, bool, error) {
	ch, err := a.channel()
	if err != nil {
		return 0, false, err
	}
	defer func() { _ = ch.Close() }()
	q, err := ch.QueueDeclarePassive(name, true, false, false, false, nil)
	if err != nil {
		var aerr *amqp.Error
		if errors.As(err, &aerr) && aerr.Code == amqp.NotFound {
			return 0, false, nil
		}
		return 0, false, err
	}
	return q.Messages, true, nil
}

// drained: nothing ready. Unacked deliveries are invisible here; the
// runner also waits for every order in the ledger and stops the consumers
// gracefully before it counts what is left.
func (a *amqpOps) drained(context.Context) (bool, error) {
	n, _, err := a.depth(a.topic)
	return err == nil && n == 0, err
}

// remaining is read after every consumer stopped, when unacked deliveries
// are back in the queue: whatever is there was never processed.
func (a *amqpOps) remaining(context.Context) (int, error) {
	n, _, err := a.depth(a.topic)
	return n, err
}

func (a *amqpOps) poisonedCount(context.Context) (int, error) {
	n, _, err := a.depth(a.topic + ".poison")
	return n, err
}

// poisoned drains the poison queue and returns each message's event_id
// and poison reason.
func (a *amqpOps) poisoned(context.Context) ([]poisonedMsg, error) {
	ch, err := a.channel()
	if err != nil {
		return nil, err
	}
	defer func() { _ = ch.Close() }()
	var ids []poisonedMsg
	for {
		d, ok, err := ch.Get(a.topic+".poison", true)
		if err != nil {
			var aerr *amqp.Error
			if errors.As(err, &aerr) && aerr.Code == amqp.NotFound {
				return ids, nil
			}
			return ids, err
		}
		if !ok {
			return ids, nil
		}
		ids = append(ids, poisonedMsg{eventID: fmt.Sprint(d.Headers["event_id"]), reason: fmt.Sprint(d.Headers[poisonReasonKey])})
	}
}

// disrupt closes this run's connections, the consumers' and this
// runner's, by name: every client must reconnect by itself. Anyone else's
// connections to the same RabbitMQ stay. Without closeOwn (-amqp-disrupt
// all) it closes every connection on the server.
func (a *amqpOps) disrupt(ctx context.Context) (string, error) {
	if !a.closeOwn {
		out, err := exec.CommandContext(ctx, "rabbitmqctl", "close_all_connections", "chaos").CombinedOutput()
		if err != nil {
			return "", fmt.Errorf("rabbitmqctl close_all_connections: %w: %s", err, out)
		}
		return "rabbitmqctl close_all_connections chaos", nil
	}
	closed, err := testenv.CloseAMQPConnections(ctx, "chaos", a.connName, a.connName+" runner")
	if err != nil {
		return "", err
	}
	if closed == 0 {
		return "", errors.New("found none of the run's RabbitMQ connections to close")
	}
	return fmt.Sprintf("rabbitmqctl close_connection on the run's %d connections (%q)", closed, a.connName), nil
}

func (a *amqpOps) close() {
	if !a.keep {
		if ch, err := a.channel(); err == nil {
			_, _ = ch.QueueDelete(a.topic, false, false, false)
			_, _ = ch.QueueDelete(a.topic+".poison", false, false, false)
			_ = ch.Close()
		}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.conn != nil {
		_ = a.conn.Close()
	}
}
