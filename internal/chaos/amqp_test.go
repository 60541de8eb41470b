package chaos

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"sync"

	amqp "github.com/rabbitmq/amqp091-go"
)

// amqpOps publishes like a plain amqp091 producer (default exchange,
// routing key = queue name, an event_id header) and redials whenever its
// connection was closed, which the chaos run does to everyone at once.
type amqpOps struct {
	url, topic string
	queueType  string // "classic" or "quorum", as the consumers' AMQP_QUEUE_TYPE
	keep       bool   // keep the queues at the end
	// closeOwn limits the disruption to the connections of pids (this
	// run's consumers) instead of every connection on the server.
	closeOwn bool
	pids     func() []int

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
	conn, err := amqp.DialConfig(a.url, amqp.Config{Properties: amqp.Table{"connection_name": "claimtx-chaos-runner"}})
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

// disrupt closes every connection RabbitMQ has: the consumers' (and this
// runner's) clients must reconnect by themselves. With closeOwn it closes
// only the connections of this run's consumer processes, for machines
// where other people's tests talk to the same RabbitMQ.
func (a *amqpOps) disrupt(ctx context.Context) (string, error) {
	if !a.closeOwn {
		out, err := exec.CommandContext(ctx, "rabbitmqctl", "close_all_connections", "chaos").CombinedOutput()
		if err != nil {
			return "", fmt.Errorf("rabbitmqctl close_all_connections: %w: %s", err, out)
		}
		return "rabbitmqctl close_all_connections chaos", nil
	}
	ports, err := localPorts(ctx, a.pids())
	if err != nil {
		return "", err
	}
	out, err := exec.CommandContext(ctx, "rabbitmqctl", "list_connections", "-q", "--no-table-headers", "pid", "peer_port").Output()
	if err != nil {
		return "", fmt.Errorf("rabbitmqctl list_connections: %w", err)
	}
	closed := 0
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) != 2 || !ports[f[1]] {
			continue
		}
		// f[0] is a connection pid as rabbitmqctl itself printed it.
		if out, err := exec.CommandContext(ctx, "rabbitmqctl", "close_connection", f[0], "chaos").CombinedOutput(); err != nil { //nolint:gosec // see above
			return "", fmt.Errorf("rabbitmqctl close_connection: %w: %s", err, out)
		}
		closed++
	}
	if closed == 0 {
		return "", errors.New("found none of the consumers' RabbitMQ connections to close")
	}
	return fmt.Sprintf("rabbitmqctl close_connection on the consumers' %d connections", closed), nil
}

// localPorts returns the local ports of the established connections to
// port 5672 owned by pids, read from ss(8).
func localPorts(ctx context.Context, pids []int) (map[string]bool, error) {
	out, err := exec.CommandContext(ctx, "ss", "-tnpH", "state", "established", "( dport = :5672 )").Output()
	if err != nil {
		return nil, fmt.Errorf("ss: %w", err)
	}
	ports := map[string]bool{}
	for _, line := range strings.Split(string(out), "\n") {
		for _, pid := range pids {
			if !strings.Contains(line, fmt.Sprintf("pid=%d,", pid)) {
				continue
			}
			f := strings.Fields(line)
			if len(f) < 3 {
				continue
			}
			if i := strings.LastIndex(f[2], ":"); i >= 0 {
				ports[f[2][i+1:]] = true
			}
		}
	}
	return ports, nil
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
