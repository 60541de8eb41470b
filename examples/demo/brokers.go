package main

import (
	"context"
	"errors"
	"fmt"

	natsgo "github.com/nats-io/nats.go"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/claimtx/claimtx/examples/loyalty/feed"
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

// kafkaOps publishes like a plain franz-go producer (kafkaRecord).
type kafkaOps struct {
	addr, topic string
	group       string
	cl          *kgo.Client
	adm         *kadm.Client
}

const partitions = 4

func (k *kafkaOps) prepare(ctx context.Context) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(k.addr), kgo.ProducerLinger(0))
	if err != nil {
		return err
	}
	k.cl, k.adm = cl, kadm.NewClient(cl)
	return feed.CreateKafkaTopics(ctx, k.adm, k.topic, partitions)
}

func (k *kafkaOps) publish(ctx context.Context, ds []delivery) error {
	recs := make([]*kgo.Record, len(ds))
	for i, d := range ds {
		recs[i] = feed.KafkaRecord(k.topic, d.eventID, d.payload)
	}
	return k.cl.ProduceSync(ctx, recs...).FirstErr()
}

// drained reports that the consumer group's committed offsets reached the
// end of every partition.
func (k *kafkaOps) drained(ctx context.Context) (bool, error) {
	lags, err := k.adm.Lag(ctx, k.group)
	if err != nil {
		return false, err
	}
	l, ok := lags[k.group]
	if !ok || l.Error() != nil {
		return false, nil
	}
	total, seen := int64(0), 0
	for _, p := range l.Lag[k.topic] {
		if p.Err != nil || p.Commit.At < 0 {
			return false, nil
		}
		total += p.Lag
		seen++
	}
	return seen == partitions && total == 0, nil
}

func (k *kafkaOps) poisoned(ctx context.Context) (int, error) {
	return feed.KafkaTopicSize(ctx, k.adm, k.topic+".poison")
}

func (k *kafkaOps) close() {
	if k.cl != nil {
		k.cl.Close()
	}
}

// natsOps publishes like a plain nats.go JetStream producer: subject =
// topic, an event_id header, nothing Watermill-specific, a fresh stream
// message per copy. The consumers run with BROKER=nats, the kind
// examples/loyalty registers from brokers/nats.
type natsOps struct {
	url, topic string
	keep       bool // keep the streams at the end
	nc         *natsgo.Conn
	js         natsgo.JetStreamContext
}

// natsDurable is the durable consumer the loyalty processes share (their
// consumer name).
const natsDurable = "loyalty"

func (n *natsOps) prepare(context.Context) error {
	nc, err := natsgo.Connect(n.url)
	if err != nil {
		return fmt.Errorf("connect to NATS at %s (start it with `nats-server -js`): %w", n.url, err)
	}
	n.nc = nc
	if n.js, err = nc.JetStream(); err != nil {
		return err
	}
	// Created up front, as the consumer would (named after the subject),
	// so nothing published before the consumers subscribe is dropped.
	_, err = n.js.AddStream(&natsgo.StreamConfig{Name: n.topic, Subjects: []string{n.topic}})
	if err != nil {
		return fmt.Errorf("create stream %s (is JetStream enabled? nats-server -js): %w", n.topic, err)
	}
	return nil
}

func (n *natsOps) publish(ctx context.Context, ds []delivery) error {
	for _, d := range ds {
		m := natsgo.NewMsg(n.topic)
		m.Header.Set("event_id", d.eventID)
		m.Data = d.payload
		if _, err := n.js.PublishMsg(m, natsgo.Context(ctx)); err != nil {
			return err
		}
	}
	return nil
}

// drained reports that the durable consumer acked everything the stream
// holds: its ack floor reached the stream's last message.
func (n *natsOps) drained(context.Context) (bool, error) {
	si, err := n.js.StreamInfo(n.topic)
	if err != nil {
		return false, err
	}
	ci, err := n.js.ConsumerInfo(n.topic, natsDurable)
	if errors.Is(err, natsgo.ErrConsumerNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return ci.AckFloor.Stream >= si.State.LastSeq && ci.NumPending == 0 && ci.NumAckPending == 0, nil
}

// poisoned counts the messages of the poison stream the consumers create
// for TOPIC.poison.
func (n *natsOps) poisoned(context.Context) (int, error) {
	si, err := n.js.StreamInfo(n.topic + "_poison")
	if errors.Is(err, natsgo.ErrStreamNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	return int(si.State.Msgs), nil
}

func (n *natsOps) close() {
	if n.nc == nil {
		return
	}
	if !n.keep {
		// Streams without limits keep everything: remove the demo's.
		_ = n.js.DeleteStream(n.topic)
		_ = n.js.DeleteStream(n.topic + "_poison")
	}
	n.nc.Close()
}
