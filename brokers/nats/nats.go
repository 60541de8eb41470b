package nats

import (
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/claimtx/claimtx/brokers"
	"github.com/claimtx/claimtx/framework"
)

// Importing the package registers the "nats" kind: a program that never
// imports it does not link nats.go.
func init() { brokers.Register(brokers.KindNATS, factory()) }

// factory is the adapter's Factory. A problem is a *framework.ConfigError
// naming "nats.<key>", which package brokers renames to the environment
// variable when the value came from one.
func factory() brokers.Factory {
	return brokers.Factory{
		NewSubscriber: func(cfg brokers.Config, logger watermill.LoggerAdapter) (message.Subscriber, error) {
			s, err := parseSettings(cfg)
			if err != nil {
				return nil, err
			}
			if s.Durable == "" { // no default: see the package documentation
				return nil, &framework.ConfigError{Field: "nats.durable",
					Reason: "is required to subscribe: the JetStream durable consumer name, one per service"}
			}
			return newSubscriber(s, logger)
		},
		NewPublisher: func(cfg brokers.Config, logger watermill.LoggerAdapter) (message.Publisher, error) {
			s, err := parseSettings(cfg)
			if err != nil {
				return nil, err
			}
			return newPublisher(s, logger)
		},
		Validate: func(cfg brokers.Config) error {
			_, err := parseSettings(cfg)
			return err
		},
	}
}
