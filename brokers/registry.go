package brokers

import (
	"errors"
	"fmt"
	"regexp"
	"sort"
	"sync"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/claimtx/claimtx/brokers/amqp"
	"github.com/claimtx/claimtx/brokers/internal/configerror"
	"github.com/claimtx/claimtx/brokers/kafka"
)

// Factory builds the publisher and subscriber of one broker kind from the
// whole Config, so a user-registered kind can read its own settings from
// Config.Options (or from anywhere else it likes).
type Factory struct {
	// NewSubscriber builds a subscriber. Required. The Config has been
	// validated; the logger is never nil.
	NewSubscriber func(cfg Config, logger watermill.LoggerAdapter) (message.Subscriber, error)

	// NewPublisher builds a publisher. Required. Same guarantees.
	NewPublisher func(cfg Config, logger watermill.LoggerAdapter) (message.Publisher, error)

	// Validate checks the parts of Config this kind uses. Optional.
	// Returning a *ConfigError lets it name the field; any other error is
	// reported as field "options".
	Validate func(cfg Config) error
}

// Registry errors, matched with errors.Is.
var (
	// ErrInvalidKind is returned by Register for an empty or malformed name
	// or an incomplete Factory.
	ErrInvalidKind = errors.New("brokers: invalid broker kind")
	// ErrKindRegistered is returned by Register for a name that is taken
	// (the built-in kinds included).
	ErrKindRegistered = errors.New("brokers: broker kind already registered")
)

var kindPattern = regexp.MustCompile(`^[a-z0-9][a-z0-9_.-]{0,62}$`)

var registry = struct {
	sync.RWMutex
	m map[string]Factory
}{m: map[string]Factory{
	KindAMQP: {
		NewSubscriber: func(c Config, l watermill.LoggerAdapter) (message.Subscriber, error) {
			return amqp.NewSubscriber(c.AMQP, l)
		},
		NewPublisher: func(c Config, l watermill.LoggerAdapter) (message.Publisher, error) {
			return amqp.NewPublisher(c.AMQP, l)
		},
		Validate: validateAMQP,
	},
	KindKafka: {
		NewSubscriber: func(c Config, l watermill.LoggerAdapter) (message.Subscriber, error) {
			sub, err := kafka.NewSubscriber(c.Kafka, l)
			if err != nil {
				// A missing consumer group is only found here: publishers
				// do not need one. Name it like Validate names the rest.
				return nil, c.named(configerror.Prefix("kafka", err))
			}
			return sub, nil
		},
		NewPublisher: func(c Config, l watermill.LoggerAdapter) (message.Publisher, error) {
			pub, err := kafka.NewPublisher(c.Kafka, l)
			if err != nil {
				return nil, c.named(configerror.Prefix("kafka", err)) // e.g. an unreadable KAFKA_TLS_CA_FILE
			}
			return pub, nil
		},
		Validate: validateKafka,
	},
	KindGoChannel: {
		NewSubscriber: newGoChannelSubscriber,
		NewPublisher:  newGoChannelPublisher,
		Validate:      validateGoChannel,
	},
}}

// Register makes a broker kind available by name, so that Config.Kind (and
// BROKER=name) selects it. Names are lower case letters, digits, '_', '-'
// and '.', at most 63 characters. It returns ErrInvalidKind or
// ErrKindRegistered (wrapped) instead of panicking; call it from an init
// function or before building a Config that uses it.
func Register(kind string, f Factory) error {
	if !kindPattern.MatchString(kind) {
		return fmt.Errorf("%w %q: want lower case letters, digits, '_', '-', '.' (1-63 characters)", ErrInvalidKind, kind)
	}
	if f.NewSubscriber == nil || f.NewPublisher == nil {
		return fmt.Errorf("%w %q: Factory.NewSubscriber and Factory.NewPublisher are required", ErrInvalidKind, kind)
	}
	registry.Lock()
	defer registry.Unlock()
	if _, ok := registry.m[kind]; ok {
		return fmt.Errorf("%w: %q", ErrKindRegistered, kind)
	}
	registry.m[kind] = f
	return nil
}

// Kinds returns the registered kind names, sorted.
func Kinds() []string {
	registry.RLock()
	defer registry.RUnlock()
	out := make([]string, 0, len(registry.m))
	for k := range registry.m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func lookup(kind string) (Factory, bool) {
	registry.RLock()
	defer registry.RUnlock()
	f, ok := registry.m[kind]
	return f, ok
}
