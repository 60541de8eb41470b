package amqp

import (
	"context"
	"errors"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/claimtx/claimtx/brokers"
	"github.com/claimtx/claimtx/framework"
)

// Importing the package makes the "amqp" kind available to every
// brokers.Registry, the way a user's adapter registers its own kind: a
// program that never imports it does not link the AMQP client.
func init() {
	brokers.Register(brokers.KindAMQP, brokers.Factory{
		NewSubscriber: func(c brokers.Config, l watermill.LoggerAdapter) (message.Subscriber, error) {
			return NewSubscriber(context.Background(), c.AMQP, l)
		},
		NewPublisher: func(c brokers.Config, l watermill.LoggerAdapter) (message.Publisher, error) {
			return NewPublisher(context.Background(), c.AMQP, l)
		},
		// brokers.Config.Validate checks the amqp section; this is what
		// only the client can tell.
		Validate: func(c brokers.Config) error { return inSection(validate(c.AMQP)) },
	})
}

// inSection names a field of err by its path in a brokers.Config
// ("amqp.queue_arguments"), as brokers.Config.Validate names the others.
func inSection(err error) error {
	var ce *framework.ConfigError
	if !errors.As(err, &ce) {
		return err
	}
	out := *ce
	out.Field = brokers.KindAMQP + "." + ce.Field
	return &out
}
