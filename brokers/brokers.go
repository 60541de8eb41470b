package brokers

import (
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
)

// NewSubscriber validates cfg and builds the subscriber of cfg.Kind.
// A nil logger logs nothing. Errors from validation are *ConfigError.
func NewSubscriber(cfg Config, logger watermill.LoggerAdapter) (message.Subscriber, error) {
	f, kind, err := factoryFor(cfg)
	if err != nil {
		return nil, err
	}
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	sub, err := f.NewSubscriber(cfg, logger)
	if err != nil {
		var ce *ConfigError
		if errors.As(err, &ce) {
			return nil, err // already says "brokers: config field …"
		}
		return nil, fmt.Errorf("brokers: %s subscriber: %w", kind, err)
	}
	return sub, nil
}

// NewPublisher validates cfg and builds the publisher of cfg.Kind.
// A nil logger logs nothing. Errors from validation are *ConfigError.
func NewPublisher(cfg Config, logger watermill.LoggerAdapter) (message.Publisher, error) {
	f, kind, err := factoryFor(cfg)
	if err != nil {
		return nil, err
	}
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	pub, err := f.NewPublisher(cfg, logger)
	if err != nil {
		var ce *ConfigError
		if errors.As(err, &ce) {
			return nil, err
		}
		return nil, fmt.Errorf("brokers: %s publisher: %w", kind, err)
	}
	return pub, nil
}

func factoryFor(cfg Config) (Factory, string, error) {
	if err := cfg.Validate(); err != nil {
		return Factory{}, "", err
	}
	kind := cfg.Kind
	if kind == "" {
		kind = DefaultKind
	}
	f, _ := lookup(kind) // Validate checked that it exists
	return f, kind, nil
}
