package main

import (
	"context"
	"fmt"

	amqp "github.com/rabbitmq/amqp091-go"
)

// amqpOps publishes like a plain amqp091 producer: default exchange,
// routing key = queue name, an event_id header, no Watermill metadata.
type amqpOps struct {
	url, topic string
	conn       *amqp.Connection
}

func (a *amqpOps) prepare(ctx context.Context) error {
	conn, err := amqp.Dial(a.url)
	if err != nil {
		return fmt.Errorf("dial RabbitMQ: %w", err)
	}
	a.conn = conn
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	defer func() { _ = ch.Close() }()
	// Declared up front so nothing published before the consumers start is
	// dropped; same arguments as the consumer's declaration.
	_, err = ch.QueueDeclare(a.topic, true, false, false, false, nil)
	return err
}

func (a *amqpOps) publish(ctx context.Context, ds []delivery) error {
	ch, err := a.conn.Channel()
	if err != nil {
		return err
	}
	defer func() { _ = ch.Close() }()
	if err := ch.Confirm(false); err != nil {
		return err
	}
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation, len(ds)))
	for i, d := range ds {
		err := ch.PublishWithContext(ctx, "", a.topic, false, false, amqp.Publishing{
			ContentType:  "application/json",
			DeliveryMode: amqp.Persistent,
			MessageId:    fmt.Sprintf("broker-id-%d", i), // differs on every copy
			Headers:      amqp.Table{"event_id": d.eventID},
			Body:         d.payload,
		})
		if err != nil {
			return err
		}
	}
	for range ds {
		if c := <-confirms; !c.Ack {
			return fmt.Errorf("RabbitMQ nacked publish %d", c.DeliveryTag)
		}
	}
	return nil
}

func (a *amqpOps) queueDepth(name string) (int, error) {
	ch, err := a.conn.Channel()
	if err != nil {
		return 0, err
	}
	defer func() { _ = ch.Close() }()
	q, err := ch.QueueDeclarePassive(name, true, false, false, false, nil)
	if err != nil {
		// 404: not declared yet (passive declare closed the channel).
		return 0, nil
	}
	return q.Messages, nil
}

// drained reports that no message is ready. Unacked ones are invisible
// here; runBroker also waits for every order to be applied and stops the
// consumers gracefully before counting.
func (a *amqpOps) drained(context.Context) (bool, error) {
	n, err := a.queueDepth(a.topic)
	return err == nil && n == 0, err
}

func (a *amqpOps) poisoned(context.Context) (int, error) {
	return a.queueDepth(a.topic + ".poison")
}

func (a *amqpOps) close() {
	if a.conn != nil {
		_ = a.conn.Close()
	}
}
