package brokers

import (
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"sync"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/internal/config"
)

// Factory builds the publisher and subscriber of one broker kind from the
// whole Config; a registered kind reads its settings from Config.Options.
type Factory struct {
	// NewSubscriber builds a subscriber. Required. The Config has been
	// validated; the logger is never nil.
	NewSubscriber func(cfg Config, logger watermill.LoggerAdapter) (message.Subscriber, error)
	// NewPublisher builds a publisher. Required. Same guarantees.
	NewPublisher func(cfg Config, logger watermill.LoggerAdapter) (message.Publisher, error)
	// Validate checks the parts of Config this kind uses. Optional.
	// Returning a *framework.ConfigError lets it name the field; any other
	// error is reported as field "options".
	Validate func(cfg Config) error
}

// ErrInvalidKind is matched by the *framework.ConfigError for a kind name
// that is malformed or not linked into the program (see Register), and for
// an incomplete Factory.
var ErrInvalidKind = errors.New("brokers: invalid broker kind")

// kindPattern: a kind is written in YAML and in BROKER, so it stays short,
// lower case and free of spaces.
var kindPattern = regexp.MustCompile(`^[a-z0-9][a-z0-9_.-]{0,62}$`)

// linked are the kinds registered with Register: kind -> Factory.
var linked sync.Map

func init() {
	Register(KindGoChannel, Factory{NewSubscriber: newGoChannelSubscriber, NewPublisher: newGoChannelPublisher})
}

// Register links a broker kind into the program, so Config.Kind (and
// BROKER=name) can select it. An adapter calls it from an init function,
// like a database/sql driver. Names are lower case letters, digits, '_',
// '-' and '.', at most 63 characters. It panics when kind is malformed, f
// is incomplete (with a *framework.ConfigError matching ErrInvalidKind) or
// kind is taken, as database/sql.Register does.
func Register(kind string, f Factory) {
	if !kindPattern.MatchString(kind) {
		panic(kindError("kind", "%q is not a broker kind name: want lower case letters, digits, '_', '-', '.' (1-63 characters)", kind))
	}
	if f.NewSubscriber == nil || f.NewPublisher == nil {
		panic(kindError("Factory", "kind %q: NewSubscriber and NewPublisher are required", kind))
	}
	if _, taken := linked.LoadOrStore(kind, f); taken {
		panic("brokers: Register called twice for kind " + kind)
	}
}

func linkedFactory(kind string) (Factory, bool) {
	f, ok := linked.Load(kind)
	fac, _ := f.(Factory) // the zero Factory when !ok
	return fac, ok
}

// kindError is a *framework.ConfigError matching ErrInvalidKind.
func kindError(field, format string, args ...any) *framework.ConfigError {
	return &framework.ConfigError{Field: field, Reason: fmt.Sprintf(format, args...), Err: ErrInvalidKind}
}

// NewSubscriber validates cfg (see Config.Validate) and builds the
// subscriber of cfg.Kind. A nil logger logs nothing. A configuration error
// is a *framework.ConfigError naming the field; other construction errors
// name the kind and wrap the adapter's error.
func NewSubscriber(cfg Config, logger watermill.LoggerAdapter) (message.Subscriber, error) {
	return build(cfg, logger, "subscriber", func(f Factory) func(Config, watermill.LoggerAdapter) (message.Subscriber, error) {
		return f.NewSubscriber
	})
}

// NewPublisher validates cfg like NewSubscriber and builds the publisher
// of cfg.Kind. Errors are as for NewSubscriber.
func NewPublisher(cfg Config, logger watermill.LoggerAdapter) (message.Publisher, error) {
	return build(cfg, logger, "publisher", func(f Factory) func(Config, watermill.LoggerAdapter) (message.Publisher, error) {
		return f.NewPublisher
	})
}

// build is NewSubscriber and NewPublisher: of picks the role's constructor.
func build[T any](cfg Config, logger watermill.LoggerAdapter, role string, of func(Factory) func(Config, watermill.LoggerAdapter) (T, error)) (T, error) {
	var zero T
	f, kind, err := factory(cfg)
	if err != nil {
		return zero, err
	}
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	v, err := of(f)(cfg, logger)
	if err != nil {
		var ce *framework.ConfigError
		if errors.As(err, &ce) {
			return zero, cfg.named(err) // "nats.durable" becomes NATS_DURABLE when the environment set it
		}
		return zero, fmt.Errorf("brokers: %s %s: %w", kind, role, err)
	}
	return v, nil
}

// factory checks cfg and returns the Factory of its kind.
func factory(cfg Config) (Factory, string, error) {
	if err := cfg.check(); err != nil {
		return Factory{}, "", err
	}
	kind := cfg.kind()
	f, ok := linkedFactory(kind)
	if !ok {
		if pkg := builtIn[kind].pkg; pkg != "" {
			return Factory{}, "", cfg.named(kindError("kind", "broker kind %q is not linked into this program: import _ %q", kind, pkg))
		}
		return Factory{}, "", cfg.named(kindError("kind", "unknown broker kind %q (known: %s)", kind, strings.Join(linkedNames(), ", ")))
	}
	if err := cfg.validateWith(kind, f); err != nil {
		return Factory{}, "", err
	}
	return f, kind, nil
}

func linkedNames() []string {
	var out []string
	linked.Range(func(k, _ any) bool { out = append(out, k.(string)); return true })
	slices.Sort(out)
	return out
}

// prefixField prefixes the Field of err's *framework.ConfigError with
// prefix and a dot: an adapter's "brokers" becomes "kafka.brokers".
func prefixField(prefix string, err error) error {
	return config.Rename(err, func(field string) (string, bool) { return prefix + "." + field, true })
}
