package amqp

import (
	"context"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/claimtx/claimtx/brokers"
)

// Importing the package makes the "amqp" kind available to
// brokers.Config.Validate, NewSubscriber and NewPublisher, the way a user's adapter registers its own kind: a
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
		Validate: func(c brokers.Config) error {
			return checkQueueArguments("amqp.queue_arguments", c.AMQP.QueueArguments)
		},
	})
}
