package brokers_test

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/claimtx/claimtx/brokers"
	"github.com/claimtx/claimtx/framework"
)

// An adapter of your own registers its kind from its package's init
// function, like a database/sql driver; importing the package is what
// links it.
func init() {
	brokers.Register("membus", brokers.Factory{
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
}

// buses serve a Watermill GoChannel per Options "bus" name; a real adapter
// would dial its broker there.
var buses = struct {
	sync.Mutex
	byName map[string]*gochannel.GoChannel
}{byName: map[string]*gochannel.GoChannel{}}

func bus(c brokers.Config, l watermill.LoggerAdapter) *gochannel.GoChannel {
	buses.Lock()
	defer buses.Unlock()
	name := c.Options["bus"]
	if buses.byName[name] == nil {
		buses.byName[name] = gochannel.NewGoChannel(gochannel.Config{Persistent: true}, l)
	}
	return buses.byName[name]
}

// The registered kind is selected by Config.Kind (BROKER=membus), with its
// settings in Config.Options.
func ExampleRegister() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	// Validate, like the constructors, runs the kind's own Validate.
	fmt.Println(brokers.Config{Kind: "membus"}.Validate())

	cfg := brokers.Config{Kind: "membus", Options: map[string]string{"bus": "orders-bus"}}
	pub, err := brokers.NewPublisher(cfg, nil)
	if err != nil {
		panic(err)
	}
	sub, err := brokers.NewSubscriber(cfg, nil)
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

	// A kind nothing registered is a configuration error.
	_, err = brokers.NewSubscriber(brokers.Config{Kind: "membsu"}, nil)
	fmt.Println(errors.Is(err, brokers.ErrInvalidKind))
	// Output:
	// claimtx: config field "options.bus": must not be empty
	// hello
	// true
}
