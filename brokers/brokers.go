package brokers

import (
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
)

// builtin is the Registry of the package-level functions. Nothing
// registers into it, so it knows the built-in kinds only.
var builtin Registry

// NewSubscriber validates cfg and builds the subscriber of cfg.Kind, one of
// the built-in kinds; use a Registry for kinds of your own. A nil logger
// logs nothing. A configuration error is a *framework.ConfigError naming
// the field.
func NewSubscriber(cfg Config, logger watermill.LoggerAdapter) (message.Subscriber, error) {
	return builtin.NewSubscriber(cfg, logger)
}

// NewPublisher validates cfg and builds the publisher of cfg.Kind, one of
// the built-in kinds; use a Registry for kinds of your own. A nil logger
// logs nothing. A configuration error is a *framework.ConfigError naming
// the field.
func NewPublisher(cfg Config, logger watermill.LoggerAdapter) (message.Publisher, error) {
	return builtin.NewPublisher(cfg, logger)
}
