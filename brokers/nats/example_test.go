package nats_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	natsgo "github.com/nats-io/nats.go"

	"github.com/claimtx/claimtx/brokers"
	"github.com/claimtx/claimtx/brokers/nats"
)

// Importing the package registers the kind "nats": package brokers then
// builds its subscribers and publishers from a brokers.Config (BROKER=nats with
// NATS_URL, NATS_DURABLE, ... through brokers.LoadConfig). The topic's
// stream is created on first use.
func Example() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	prefix := examplePrefix() // isolates this run's subjects and streams
	defer dropExampleStreams(prefix)

	cfg := brokers.Config{Kind: brokers.KindNATS, NATS: brokers.NATSConfig{
		URL: exampleURL(), Durable: "loyalty", SubjectPrefix: prefix,
	}}

	pub, err := brokers.NewPublisher(cfg, nil)
	if err != nil {
		panic(err)
	}
	defer pub.Close()
	msg := message.NewMessage("m1", []byte(`{"order_id":9912}`))
	msg.Metadata.Set("event_id", "evt-42")
	if err := pub.Publish("orders", msg); err != nil {
		panic(err)
	}

	sub, err := brokers.NewSubscriber(cfg, nil)
	if err != nil {
		panic(err)
	}
	defer sub.Close()
	msgs, err := sub.Subscribe(ctx, "orders")
	if err != nil {
		panic(err)
	}
	m := <-msgs
	m.Ack()
	fmt.Println(m.UUID, string(m.Payload), m.Metadata.Get("event_id"), m.Metadata.Get("nats_delivered"))
	fmt.Println(m.Metadata.Get("nats_subject") == prefix+"orders")

	// A setting that cannot be used is refused before anything connects.
	cfg.NATS.AckWait = 10 * time.Millisecond
	_, err = brokers.NewSubscriber(cfg, nil)
	fmt.Println(err)
	// Output:
	// m1 {"order_id":9912} evt-42 1
	// true
	// claimtx: config field "nats.ack_wait": must be at least 1s, got 10ms
}

// Its settings are checked before anything connects.
func Example_validation() {
	_, err := brokers.NewSubscriber(brokers.Config{Kind: brokers.KindNATS, NATS: brokers.NATSConfig{URL: exampleURL()}}, nil)
	fmt.Println(err)
	// Output:
	// claimtx: config field "nats.durable": is required to subscribe: the JetStream durable consumer name, one per service
}

// The publisher creates the topic's stream on first use and returns once
// JetStream acknowledged the message; a plain NATS client reads it back.
func ExampleNewPublisher() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	prefix := examplePrefix()
	defer dropExampleStreams(prefix)

	pub, err := nats.NewPublisher(ctx, brokers.NATSConfig{URL: exampleURL(), SubjectPrefix: prefix}, nil)
	if err != nil {
		panic(err)
	}
	defer pub.Close()
	msg := message.NewMessage("m1", []byte(`{"order_id":9912}`))
	msg.Metadata.Set("event_id", "evt-42")
	if err := pub.Publish("orders", msg); err != nil {
		panic(err)
	}

	nc, err := natsgo.Connect(exampleURL())
	if err != nil {
		panic(err)
	}
	defer nc.Close()
	js, err := nc.JetStream()
	if err != nil {
		panic(err)
	}
	stream, err := js.StreamNameBySubject(prefix + "orders")
	if err != nil {
		panic(err)
	}
	stored, err := js.GetLastMsg(stream, prefix+"orders")
	if err != nil {
		panic(err)
	}
	fmt.Println(string(stored.Data), stored.Header.Get("event_id"))
	// Output:
	// {"order_id":9912} evt-42
}

// The subscriber pulls from the durable consumer named Durable, one per
// service, which it creates with the stream on first use.
func ExampleNewSubscriber() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	prefix := examplePrefix()
	defer dropExampleStreams(prefix)
	cfg := brokers.NATSConfig{URL: exampleURL(), Durable: "loyalty", SubjectPrefix: prefix}

	sub, err := nats.NewSubscriber(ctx, cfg, nil)
	if err != nil {
		panic(err)
	}
	defer sub.Close()
	msgs, err := sub.Subscribe(ctx, "orders")
	if err != nil {
		panic(err)
	}
	pub, err := nats.NewPublisher(ctx, cfg, nil)
	if err != nil {
		panic(err)
	}
	defer pub.Close()
	if err := pub.Publish("orders", message.NewMessage("m1", []byte(`{"order_id":9912}`))); err != nil {
		panic(err)
	}
	m := <-msgs
	m.Ack()
	fmt.Println(m.UUID, string(m.Payload), m.Metadata.Get("nats_delivered"))

	// Without Durable there is nothing to pull from.
	_, err = nats.NewSubscriber(ctx, brokers.NATSConfig{URL: exampleURL()}, nil)
	fmt.Println(err)
	// Output:
	// m1 {"order_id":9912} 1
	// claimtx: config field "nats.durable": is required to subscribe: the JetStream durable consumer name, one per service
}

// exampleURL is the NATS server the tests use (TEST_NATS_URL, else the
// local one).
func exampleURL() string {
	if u := os.Getenv("TEST_NATS_URL"); u != "" {
		return u
	}
	return "nats://127.0.0.1:4222"
}

// examplePrefix returns a subject prefix unique to this run.
func examplePrefix() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return "claimtx-example-" + hex.EncodeToString(b[:]) + "."
}

// dropExampleStreams removes the streams the example created, the ones named
// after its prefixed subjects.
func dropExampleStreams(prefix string) {
	nc, err := natsgo.Connect(exampleURL())
	if err != nil {
		return
	}
	defer nc.Close()
	js, err := nc.JetStream()
	if err != nil {
		return
	}
	var names []string
	for name := range js.StreamNames() {
		if strings.HasPrefix(name, strings.TrimSuffix(prefix, ".")) {
			names = append(names, name)
		}
	}
	for _, name := range names {
		_ = js.DeleteStream(name)
	}
}
