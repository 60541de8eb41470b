package amqp

import (
	"context"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/claimtx/claimtx/brokers"
)

// Importing the package registers the "amqp" kind: a program that never
// imports it does not link the AMQP client.
func init() {
	brokers.Register(brokers.KindAMQP, brokers.Factory{
		NewSubscriber: func(c brokers.Config, l watermill.LoggerAdapter) (message.Subscriber, error) {
			return NewSubscriber(context.Background(), c.AMQP, l)
		},
		NewPublisher: func(c brokers.Config, l watermill.LoggerAdapter) (message.Publisher, error) {
			return NewPublisher(context.Background(), c.AMQP, l)
		},
		Validate: func(c brokers.Config) error {
			return checkQueueArguments("amqp.queue_arguments", c.AMQP.QueueArguments)
		},
	})
}
