package main

import (
	"context"
	"errors"
	"fmt"

	natsgo "github.com/nats-io/nats.go"
)

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
