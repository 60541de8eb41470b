package brokers_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/claimtx/claimtx/brokers"
	"github.com/claimtx/claimtx/framework"
)

// The broker is chosen by configuration: the same code consumes from
// RabbitMQ or Kafka when the Config says so (BROKER=kafka with
// LoadConfig("")). Here it is the in-process "gochannel" kind.
func Example() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	cfg := brokers.Config{Kind: brokers.KindGoChannel, GoChannel: brokers.GoChannelConfig{Name: "example"}}
	sub, err := brokers.NewSubscriber(cfg, nil)
	if err != nil {
		panic(err)
	}
	defer sub.Close()
	pub, err := brokers.NewPublisher(cfg, nil)
	if err != nil {
		panic(err)
	}
	defer pub.Close()

	msgs, err := sub.Subscribe(ctx, "orders")
	if err != nil {
		panic(err)
	}
	if err := pub.Publish("orders", message.NewMessage("m1", []byte(`{"order_id":7}`))); err != nil {
		panic(err)
	}
	m := <-msgs
	fmt.Println(string(m.Payload))
	m.Ack()

	// A bad value is a *framework.ConfigError naming the field.
	_, err = brokers.NewSubscriber(brokers.Config{Kind: brokers.KindKafka}, nil)
	var ce *framework.ConfigError
	fmt.Println(errors.As(err, &ce), ce.Field)
	// Output:
	// {"order_id":7}
	// true kafka.consumer_group
}
