package nats

import (
	"cmp"
	"context"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/claimtx/claimtx/brokers"
	"github.com/claimtx/claimtx/framework"
)

// Importing the package registers the "nats" kind: a program that never
// imports it does not link nats.go.
func init() {
	brokers.Register(brokers.KindNATS, brokers.Factory{
		NewSubscriber: func(cfg brokers.Config, logger watermill.LoggerAdapter) (message.Subscriber, error) {
			return NewSubscriber(context.Background(), cfg.NATS, logger)
		},
		NewPublisher: func(cfg brokers.Config, logger watermill.LoggerAdapter) (message.Publisher, error) {
			return NewPublisher(context.Background(), cfg.NATS, logger)
		},
		Validate: func(cfg brokers.Config) error {
			_, err := parseSettings(cfg)
			return err
		},
	})
}

// NewSubscriber validates cfg and connects to NATS, retrying until
// DialTimeout passes or ctx ends (ctx bounds the start-up only). A nil
// logger logs nothing. A problem with cfg is a *framework.ConfigError
// naming "nats.<key>"; Durable is required. The subscriber pulls from the
// durable JetStream consumer of each topic's stream, creating both on
// first use, and also has SubscribeInitialize, IsConnected (readiness,
// observe.SubscriberConnected) and ReplayHorizon (see
// brokers.UnboundedHorizon).
func NewSubscriber(ctx context.Context, cfg brokers.NATSConfig, logger watermill.LoggerAdapter) (message.Subscriber, error) {
	s, err := validSettings(cfg)
	if err != nil {
		return nil, err
	}
	if s.Durable == "" { // no default: see the package documentation
		return nil, &framework.ConfigError{Field: "nats.durable",
			Reason: "is required to subscribe: the JetStream durable consumer name, one per service"}
	}
	return newSubscriber(ctx, s, cmp.Or[watermill.LoggerAdapter](logger, watermill.NopLogger{}))
}

// NewPublisher validates cfg and connects as NewSubscriber does (with the
// same errors; Durable is not needed). Publish ensures the topic's stream
// and returns once JetStream acknowledged every message.
func NewPublisher(ctx context.Context, cfg brokers.NATSConfig, logger watermill.LoggerAdapter) (message.Publisher, error) {
	s, err := validSettings(cfg)
	if err != nil {
		return nil, err
	}
	return newPublisher(ctx, s, cmp.Or[watermill.LoggerAdapter](logger, watermill.NopLogger{}))
}

// validSettings checks cfg as brokers.Config.Validate checks its nats
// section, then applies the defaults.
func validSettings(cfg brokers.NATSConfig) (settings, error) {
	full := brokers.Config{Kind: brokers.KindNATS, NATS: cfg}
	if err := full.Validate(); err != nil {
		return settings{}, err
	}
	return parseSettings(full)
}
