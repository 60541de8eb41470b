package brokers_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

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

// An adapter of your own: a Factory registered under a name with a
// Registry, selected by Config.Kind (BROKER=inmem), with its settings in
// Config.Options. This one serves a Watermill GoChannel per Options
// "bus" name; a real one would dial its broker there.
func ExampleRegistry() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	buses := map[string]*gochannel.GoChannel{}
	bus := func(c brokers.Config, l watermill.LoggerAdapter) *gochannel.GoChannel {
		name := c.Options["bus"]
		if buses[name] == nil {
			buses[name] = gochannel.NewGoChannel(gochannel.Config{Persistent: true}, l)
		}
		return buses[name]
	}
	defer func() {
		for _, b := range buses {
			_ = b.Close()
		}
	}()

	reg := brokers.NewRegistry() // knows amqp, kafka and gochannel already
	err := reg.Register("inmem", brokers.Factory{
		NewSubscriber: func(c brokers.Config, l watermill.LoggerAdapter) (message.Subscriber, error) {
			return bus(c, l), nil
		},
		NewPublisher: func(c brokers.Config, l watermill.LoggerAdapter) (message.Publisher, error) {
			return bus(c, l), nil
		},
		Validate: func(c brokers.Config) error {
			if c.Options["bus"] == "" {
				return &framework.ConfigError{Field: "options.bus", Reason: "must not be empty"}
			}
			return nil
		},
	})
	if err != nil {
		panic(err)
	}

	// Built by the Registry, its own Validate runs first.
	_, err = reg.NewSubscriber(brokers.Config{Kind: "inmem"}, nil)
	fmt.Println(err)

	cfg := brokers.Config{Kind: "inmem", Options: map[string]string{"bus": "orders-bus"}}
	pub, err := reg.NewPublisher(cfg, nil)
	if err != nil {
		panic(err)
	}
	sub, err := reg.NewSubscriber(cfg, nil)
	if err != nil {
		panic(err)
	}
	msgs, err := sub.Subscribe(ctx, "orders")
	if err != nil {
		panic(err)
	}
	if err := pub.Publish("orders", message.NewMessage("m1", []byte("hello"))); err != nil {
		panic(err)
	}
	m := <-msgs
	fmt.Println(string(m.Payload))
	m.Ack()

	// The package-level functions know the built-in kinds only.
	_, err = brokers.NewSubscriber(cfg, nil)
	fmt.Println(errors.Is(err, brokers.ErrInvalidKind))
	// Output:
	// claimtx: config field "options.bus": must not be empty
	// hello
	// true
}
