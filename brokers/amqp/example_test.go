package amqp_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/claimtx/claimtx/brokers"
	"github.com/claimtx/claimtx/brokers/amqp"
)

// The subscriber consumes the durable queue named like the topic, which
// any AMQP producer reaches through the default exchange with the topic as
// routing key; here a plain amqp091 client publishes. The delivery's
// properties are added to the metadata.
func ExampleNewSubscriber() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	topic := exampleQueue()
	defer deleteQueue(topic)

	sub, err := amqp.NewSubscriber(ctx, brokers.AMQPConfig{URL: exampleURL(), Concurrency: 2}, nil)
	if err != nil {
		panic(err)
	}
	defer sub.Close()
	msgs, err := sub.Subscribe(ctx, topic) // declares the queue
	if err != nil {
		panic(err)
	}

	plainPublish(ctx, topic, amqp091.Publishing{
		MessageId: "m1", Headers: amqp091.Table{"event_id": "evt-42", "attempt": int64(3)},
		Body: []byte(`{"order_id":9912}`),
	})
	m := <-msgs
	m.Ack()
	fmt.Println(m.UUID, string(m.Payload))
	fmt.Println(m.Metadata.Get("event_id"), m.Metadata.Get("attempt"), m.Metadata.Get("amqp_routing_key") == topic)

	// An invalid brokers.AMQPConfig names the field by its YAML key.
	_, err = amqp.NewSubscriber(ctx, brokers.AMQPConfig{Window: -1}, nil)
	fmt.Println(err)
	// Output:
	// m1 {"order_id":9912}
	// evt-42 3 true
	// claimtx: config field "window": must not be negative (0 disables the window mode), got -1
}

// The publisher declares the topic's durable queue before its first
// publish and returns once RabbitMQ confirmed the message, which it sends
// persistent, metadata as string headers.
func ExampleNewPublisher() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	topic := exampleQueue()
	defer deleteQueue(topic)

	pub, err := amqp.NewPublisher(ctx, brokers.AMQPConfig{URL: exampleURL()}, nil)
	if err != nil {
		panic(err)
	}
	defer pub.Close()

	msg := message.NewMessage("m1", []byte(`{"order_id":9912}`))
	msg.Metadata.Set("event_id", "evt-42")
	if err := pub.Publish(topic, msg); err != nil {
		panic(err)
	}

	d := plainGet(topic)
	fmt.Println(d.MessageId, string(d.Body), d.Headers["event_id"], d.DeliveryMode == amqp091.Persistent)
	// Output:
	// m1 {"order_id":9912} evt-42 true
}

// exampleURL is the RabbitMQ the tests use (TEST_AMQP_URL, else the
// local one).
func exampleURL() string {
	if u := os.Getenv("TEST_AMQP_URL"); u != "" {
		return u
	}
	return "amqp://guest:guest@127.0.0.1:5672/"
}

// exampleQueue returns a queue name unique to this run.
func exampleQueue() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return "claimtx-example-" + hex.EncodeToString(b[:])
}

// plainChannel opens a plain amqp091 channel, as a producer that knows
// nothing of claimtx or Watermill does; done closes its connection.
func plainChannel() (ch *amqp091.Channel, done func()) {
	conn, err := amqp091.Dial(exampleURL())
	if err != nil {
		panic(err)
	}
	if ch, err = conn.Channel(); err != nil {
		panic(err)
	}
	return ch, func() { _ = conn.Close() }
}

// plainPublish publishes p to the default exchange with routing key topic.
func plainPublish(ctx context.Context, topic string, p amqp091.Publishing) {
	ch, done := plainChannel()
	defer done()
	if err := ch.PublishWithContext(ctx, "", topic, true, false, p); err != nil {
		panic(err)
	}
}

// plainGet takes one message off queue with a plain amqp091 basic.get.
func plainGet(queue string) amqp091.Delivery {
	ch, done := plainChannel()
	defer done()
	d, ok, err := ch.Get(queue, true)
	if err != nil || !ok {
		panic(fmt.Sprint("no message in ", queue, ": ", err))
	}
	return d
}

// deleteQueue removes the durable queue the example declared.
func deleteQueue(name string) {
	ch, done := plainChannel()
	defer done()
	_, _ = ch.QueueDelete(name, false, false, false)
}
