package brokers

import (
	"errors"
	"fmt"
	"regexp"
	"sort"
	"strings"
	"sync"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/claimtx/claimtx/framework"
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
	// Returning a *framework.ConfigError lets it name the field; any other
	// error is reported as field "options".
	Validate func(cfg Config) error
}

// Registry errors, matched with errors.Is.
var (
	// ErrInvalidKind is matched by the error for a kind name that is
	// malformed or that a Registry does not know, and for an incomplete
	// Factory. Those errors are *framework.ConfigError values naming the
	// field ("kind", or BROKER when the kind came from the environment).
	ErrInvalidKind = errors.New("brokers: invalid broker kind")
	// ErrKindRegistered is returned by Registry.Register for a name that is
	// taken (the built-in kinds included).
	ErrKindRegistered = errors.New("brokers: broker kind already registered")
)

// kindPattern is what a kind name looks like: it is written in YAML and in
// BROKER, so it stays short, lower case and free of spaces.
var kindPattern = regexp.MustCompile(`^[a-z0-9][a-z0-9_.-]{0,62}$`)

// linked are the kinds registered with Register: the adapters linked into
// the program, known to every Registry.
var linked = struct {
	sync.RWMutex
	kinds map[string]Factory
}{kinds: map[string]Factory{}}

// adapterPackages are the adapters that ship with claimtx, for the error
// about a kind that is not linked: it says what to import.
var adapterPackages = map[string]string{
	KindAMQP:  "github.com/claimtx/claimtx/brokers/amqp",
	KindKafka: "github.com/claimtx/claimtx/brokers/kafka",
	KindNATS:  "github.com/claimtx/claimtx/brokers/nats",
}

func init() {
	Register(KindGoChannel, Factory{
		NewSubscriber: newGoChannelSubscriber,
		NewPublisher:  newGoChannelPublisher,
	})
}

// Register links a broker kind into the program: every Registry, and the
// package-level NewSubscriber and NewPublisher, know it from then on. An
// adapter calls it from an init function, like a database/sql driver, so
// importing the adapter's package (a blank import will do) is what makes
// its kind, and its client library, part of a program; brokers/amqp,
// brokers/kafka and brokers/nats register "amqp", "kafka" and "nats" so.
// It panics when kind is malformed, f is incomplete or kind is taken:
// those are programming errors found at start-up. Registry.Register adds a
// kind to one Registry only.
func Register(kind string, f Factory) {
	if err := checkFactory(kind, f); err != nil {
		panic(err)
	}
	linked.Lock()
	defer linked.Unlock()
	if _, ok := linked.kinds[kind]; ok {
		panic(fmt.Errorf("%w: %q", ErrKindRegistered, kind))
	}
	linked.kinds[kind] = f
}

// linkedFactory returns the Factory Register linked for kind.
func linkedFactory(kind string) (Factory, bool) {
	linked.RLock()
	defer linked.RUnlock()
	f, ok := linked.kinds[kind]
	return f, ok
}

// checkFactory refuses a malformed kind name or an incomplete Factory.
func checkFactory(kind string, f Factory) error {
	if !kindPattern.MatchString(kind) {
		return &framework.ConfigError{Field: "kind", Reason: fmt.Sprintf("%q is not a broker kind name: want lower case letters, digits, '_', '-', '.' (1-63 characters)", kind), Err: ErrInvalidKind}
	}
	if f.NewSubscriber == nil || f.NewPublisher == nil {
		return &framework.ConfigError{Field: "Factory", Reason: fmt.Sprintf("kind %q: NewSubscriber and NewPublisher are required", kind), Err: ErrInvalidKind}
	}
	return nil
}

// Registry maps broker kinds to the Factory that builds them, so that
// Config.Kind (and BROKER=name) can select an adapter of your own. Every
// Registry knows the built-in kinds; Register adds more. A Registry is safe
// for concurrent use. The zero Registry is ready to use, like NewRegistry's.
//
// The package-level NewSubscriber and NewPublisher use a Registry that
// knows the linked kinds only, so no part of a program changes what
// another part's Config selects except by linking an adapter.
type Registry struct {
	mu    sync.RWMutex
	kinds map[string]Factory // kinds of this Registry only; the linked ones are in linked
}

// NewRegistry returns a Registry that knows the linked kinds: "gochannel",
// and those of the adapters the program imports (see Register).
func NewRegistry() *Registry {
	return &Registry{}
}

// Register makes a broker kind available by name. Names are lower case
// letters, digits, '_', '-' and '.', at most 63 characters. A malformed
// name or a Factory without NewSubscriber or NewPublisher is a
// *framework.ConfigError matching ErrInvalidKind; a name that is taken
// (the linked ones included) is refused with ErrKindRegistered. It never
// panics.
func (r *Registry) Register(kind string, f Factory) error {
	if err := checkFactory(kind, f); err != nil {
		return err
	}
	if _, ok := linkedFactory(kind); ok {
		return fmt.Errorf("%w: %q is linked (see Register)", ErrKindRegistered, kind)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.kinds[kind]; ok {
		return fmt.Errorf("%w: %q", ErrKindRegistered, kind)
	}
	if r.kinds == nil {
		r.kinds = make(map[string]Factory)
	}
	r.kinds[kind] = f
	return nil
}

// NewSubscriber validates cfg (Config.Validate, then the kind's own
// Factory.Validate) and builds the subscriber of cfg.Kind. A nil logger
// logs nothing. A configuration error is a *framework.ConfigError; a kind
// r does not know also matches ErrInvalidKind. Other construction errors
// name the kind and wrap the adapter's error.
func (r *Registry) NewSubscriber(cfg Config, logger watermill.LoggerAdapter) (message.Subscriber, error) {
	f, kind, err := r.factory(cfg)
	if err != nil {
		return nil, err
	}
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	sub, err := f.NewSubscriber(cfg, logger)
	if err != nil {
		var ce *framework.ConfigError
		if errors.As(err, &ce) {
			// Named like Validate's errors: a registered kind's
			// "options.durable" becomes NATS_DURABLE when the
			// environment set it (or, with LoadConfig(""), should have).
			return nil, cfg.named(err)
		}
		return nil, fmt.Errorf("brokers: %s subscriber: %w", kind, err)
	}
	return sub, nil
}

// NewPublisher validates cfg like NewSubscriber and builds the publisher
// of cfg.Kind. Errors are as for NewSubscriber.
func (r *Registry) NewPublisher(cfg Config, logger watermill.LoggerAdapter) (message.Publisher, error) {
	f, kind, err := r.factory(cfg)
	if err != nil {
		return nil, err
	}
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	pub, err := f.NewPublisher(cfg, logger)
	if err != nil {
		var ce *framework.ConfigError
		if errors.As(err, &ce) {
			return nil, cfg.named(err)
		}
		return nil, fmt.Errorf("brokers: %s publisher: %w", kind, err)
	}
	return pub, nil
}

// Validate checks cfg as NewSubscriber and NewPublisher will, without
// building anything: Config.Validate, then that the kind is one r knows and
// its Factory.Validate. A consumer calls it before it connects anywhere, so
// a misspelt BROKER fails at once.
func (r *Registry) Validate(cfg Config) error {
	_, _, err := r.factory(cfg)
	return err
}

// factory validates cfg and returns the Factory of its kind.
func (r *Registry) factory(cfg Config) (Factory, string, error) {
	if err := cfg.Validate(); err != nil {
		return Factory{}, "", err
	}
	kind := cfg.kind()
	f, ok := linkedFactory(kind)
	if !ok {
		r.mu.RLock()
		f, ok = r.kinds[kind]
		r.mu.RUnlock()
	}
	if !ok && adapterPackages[kind] != "" {
		return Factory{}, "", cfg.named(&framework.ConfigError{
			Field:  "kind",
			Reason: fmt.Sprintf("broker kind %q is not linked into this program: import _ %q", kind, adapterPackages[kind]),
			Err:    ErrInvalidKind,
		})
	}
	if !ok {
		return Factory{}, "", cfg.named(&framework.ConfigError{
			Field:  "kind",
			Reason: fmt.Sprintf("unknown broker kind %q (known: %s)", kind, strings.Join(r.names(), ", ")),
			Err:    ErrInvalidKind,
		})
	}
	if err := cfg.validateWith(kind, f); err != nil {
		return Factory{}, "", err
	}
	return f, kind, nil
}

// names returns the kinds r knows, sorted, for error messages.
func (r *Registry) names() []string {
	linked.RLock()
	out := make([]string, 0, len(linked.kinds)+len(r.kinds))
	for k := range linked.kinds {
		out = append(out, k)
	}
	linked.RUnlock()
	r.mu.RLock()
	defer r.mu.RUnlock()
	for k := range r.kinds {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// prefixField returns a copy of err's *framework.ConfigError whose Field is
// prefixed with prefix and a dot, so an adapter's "brokers" becomes
// "kafka.brokers", the YAML path. Other errors are returned unchanged.
func prefixField(prefix string, err error) error {
	var ce *framework.ConfigError
	if !errors.As(err, &ce) {
		return err
	}
	out := *ce
	out.Field = prefix + "." + ce.Field
	return &out
}
