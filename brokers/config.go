package brokers

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"os"
	"strings"

	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/internal/config"
)

// Built-in kinds.
const (
	KindAMQP      = "amqp"      // brokers/amqp
	KindKafka     = "kafka"     // brokers/kafka
	KindNATS      = "nats"      // brokers/nats
	KindGoChannel = "gochannel" // in this package
)

// Config selects and configures a broker adapter. The zero value is usable:
// every field takes its documented default.
type Config struct {
	// Kind names the adapter: "amqp" (RabbitMQ), "kafka", "nats",
	// "gochannel" (in-process, for tests) or a kind registered with
	// Register. Defaults to "amqp".
	Kind string `yaml:"kind" env:"BROKER" default:"amqp"`
	// AMQP configures the "amqp" kind (brokers/amqp).
	AMQP AMQPConfig `yaml:"amqp"`
	// Kafka configures the "kafka" kind (brokers/kafka).
	Kafka KafkaConfig `yaml:"kafka"`
	// NATS configures the "nats" kind (brokers/nats).
	NATS NATSConfig `yaml:"nats"`
	// GoChannel configures the "gochannel" kind.
	GoChannel GoChannelConfig `yaml:"gochannel"`
	// Options carries the settings of user-registered kinds (see the
	// package documentation). Defaults to none.
	Options map[string]string `yaml:"options"`
	// envSet maps the YAML path of each field a variable set to the
	// variable, so that errors name what the user wrote. Copies of a Config
	// share it: it is replaced, never written to.
	envSet map[string]string
	// envOnly is true for LoadConfig(""): without a file, even a field left
	// at its default (a missing KAFKA_CONSUMER_GROUP) is set by its variable.
	envOnly bool
}

func (c Config) kind() string { return cmp.Or(c.Kind, KindAMQP) }

// envSettings are the variables that override a file, as Config's env tags
// declare them.
var envSettings = config.Settings[Config]()

// named returns err with its Field replaced by the environment variable the
// value came from (or, with LoadConfig(""), would come from).
func (c Config) named(err error) error {
	return config.Rename(err, func(field string) (string, bool) {
		if name, ok := c.envSet[field]; ok || !c.envOnly {
			return name, ok
		}
		for _, s := range envSettings {
			if s.Path == field {
				return s.Env, true
			}
		}
		// A registered kind's option left unset: the variable that would set it.
		option, ok := strings.CutPrefix(field, "options.")
		prefix := optionEnvPrefix(c.kind())
		return prefix + strings.ToUpper(option), ok && option != "" && prefix != ""
	})
}

// GoChannelConfig configures the in-process "gochannel" kind. Publishers
// and subscribers built from equal GoChannelConfig values share one
// process-wide Watermill GoChannel (see the package documentation).
type GoChannelConfig struct {
	// Name separates independent in-process brokers. Defaults to "default".
	Name string `yaml:"name" default:"default"`
	// Buffer is the output channel buffer of each subscription.
	// Defaults to 0 (unbuffered).
	Buffer int64 `yaml:"buffer"`
	// Persistent keeps every published message in memory and replays it to
	// subscribers that arrive later; memory grows with every message.
	// Defaults to false: a message nobody subscribes to is dropped.
	Persistent bool `yaml:"persistent"`
	// BlockPublishUntilSubscriberAck makes Publish wait until every
	// subscriber acked the message. Defaults to false.
	BlockPublishUntilSubscriberAck bool `yaml:"block_publish_until_subscriber_ack"`
}

func (g GoChannelConfig) validate() error {
	return firstError(when(g.Buffer < 0, "buffer", "must not be negative, got %d", g.Buffer))
}

// defaultConfig is what LoadConfig starts from, every default written out.
// Kafka's HeartbeatInterval stays zero, derived from SessionTimeout later,
// so that a shorter session does not also need a shorter heartbeat.
func defaultConfig() Config { return config.Defaults(Config{}) }

// Validate checks c as NewSubscriber and NewPublisher will, without
// building anything: the section of Config the selected kind reads, that
// the kind is linked (see Register), and its Factory.Validate. Call it
// before connecting anywhere, so a misspelt BROKER fails at once.
func (c Config) Validate() error {
	_, _, err := factory(c)
	return err
}

// check is what LoadConfig checks: a built-in kind's section, with its
// adapter's checks when linked; any other kind's name only, as the program
// may still fill in its options or link it.
func (c Config) check() error {
	kind := c.kind()
	if b, ok := builtIn[kind]; ok {
		if err := b.check(c); err != nil {
			return c.named(prefixField(kind, err))
		}
		if f, ok := linkedFactory(kind); ok {
			return c.validateWith(kind, f) // what only the adapter's client can tell
		}
		return nil
	}
	if !kindPattern.MatchString(kind) {
		return c.named(kindError("kind", "%q is not a broker kind (built in: %s, %s, %s, %s; a registered kind is lower case letters, digits, '_', '-', '.')", kind, KindAMQP, KindKafka, KindNATS, KindGoChannel))
	}
	return nil
}

// validateWith runs f.Validate on c. An error that is not a
// *framework.ConfigError is reported as field "options".
func (c Config) validateWith(kind string, f Factory) error {
	if f.Validate == nil {
		return nil
	}
	err := f.Validate(c)
	var ce *framework.ConfigError
	if err == nil || errors.As(err, &ce) {
		return c.named(err)
	}
	return &framework.ConfigError{Field: "options", Reason: fmt.Sprintf("refused by broker kind %q", kind), Err: err}
}

// builtIn are the kinds Config has a section for: check validates it,
// whether or not the adapter is linked (errors name the field within the
// section), and pkg is what to import when it is not.
var builtIn = map[string]struct {
	check func(Config) error
	pkg   string
}{
	KindAMQP:      {func(c Config) error { return c.AMQP.Validate() }, "github.com/claimtx/claimtx/brokers/amqp"},
	KindKafka:     {func(c Config) error { return c.Kafka.Validate() }, "github.com/claimtx/claimtx/brokers/kafka"},
	KindNATS:      {func(c Config) error { return c.NATS.validate() }, "github.com/claimtx/claimtx/brokers/nats"},
	KindGoChannel: {func(c Config) error { return c.GoChannel.validate() }, ""}, // always linked
}

// String prints the config with its secrets redacted (see the package
// documentation, "Secrets").
func (c Config) String() string {
	return fmt.Sprintf("{Kind:%q AMQP:%s Kafka:%s NATS:%s GoChannel:%+v Options:%v}", c.Kind, c.AMQP, c.Kafka, c.NATS, c.GoChannel, redactOptions(c.Options))
}

// redactOptions returns a copy of opts fit to print: a registered kind
// cannot redact what Config.String prints, so it names its secret options
// to match this rule (MY_BUS_PASSWORD).
func redactOptions(opts map[string]string) map[string]string {
	out := maps.Clone(opts)
	for k, v := range out {
		if config.SecretName(k) {
			out[k] = config.Redact(v)
		} else if strings.Contains(v, "://") {
			out[k] = config.RedactURL(v)
		}
	}
	return out
}

// GoString makes %#v redact too.
func (c Config) GoString() string { return "brokers.Config" + c.String() }

// LoadConfig returns the defaults, overlaid with the YAML file at path
// (none when path is ""), overlaid with the environment variables listed
// in the package documentation, checked as the package documentation
// ("Errors") says. Every field of the result holds its effective value.
func LoadConfig(path string) (Config, error) {
	if path == "" {
		c := defaultConfig()
		c.envOnly = true
		return c.withEnv()
	}
	data, err := os.ReadFile(path) //nolint:gosec // reading the file the caller names is the point
	if err != nil {
		return Config{}, fmt.Errorf("brokers: read config: %w", err)
	}
	c, err := parseConfig(data)
	if err != nil {
		return Config{}, fmt.Errorf("brokers: config file %s: %w", path, err)
	}
	return c.withEnv()
}

func init() {
	// framework/consumer reads the "broker:" section of its file so.
	config.RegisterSection(func(data []byte) (Config, error) {
		c, err := parseConfig(data)
		if err != nil {
			return Config{}, err
		}
		return c.withEnv()
	})
	// The dead-letter tooling names its "kind" errors as Validate does.
	config.RegisterNamer(Config.named)
}

// withEnv is c with the environment over it, validated.
func (c Config) withEnv() (Config, error) {
	c, err := c.overlayEnv(os.LookupEnv)
	if err != nil {
		return Config{}, err
	}
	if c.kind() == KindNATS {
		if err := checkNATSEnv(os.Environ()); err != nil {
			return Config{}, err
		}
	}
	c = c.overlayOptionEnv(os.Environ())
	return c, c.check()
}

// parseConfig decodes YAML over defaultConfig, without the environment and
// without validating.
func parseConfig(data []byte) (Config, error) {
	c := defaultConfig()
	if err := config.Decode(data, &c); err != nil {
		var ce *framework.ConfigError
		if errors.As(err, &ce) {
			return Config{}, err
		}
		return Config{}, fmt.Errorf("brokers: %w", err)
	}
	return c, nil
}

// overlayEnv returns c with every variable lookup finds applied, each
// recorded as the source of its field.
func (c Config) overlayEnv(lookup func(string) (string, bool)) (Config, error) {
	err := config.ApplyEnv(&c, envSettings, lookup, func(s config.Setting[Config], name string) { c.envSet = with(c.envSet, s.Path, name) })
	if err != nil {
		return Config{}, err
	}
	return c, nil
}

// optionEnvPrefix is the prefix of the variables that set the Options of a
// registered kind: the kind in upper case with '.' and '-' as '_', then '_'
// ("my-bus" -> "MY_BUS_"). Built-in kinds have their own variables: "".
func optionEnvPrefix(kind string) string {
	if _, ok := builtIn[kind]; ok || !kindPattern.MatchString(kind) {
		return ""
	}
	return strings.ToUpper(strings.NewReplacer(".", "_", "-", "_").Replace(kind)) + "_"
}

// overlayOptionEnv copies every variable of environ ("NAME=value") named
// <prefix><OPTION> into Options["<option>"], recorded as the source of
// "options.<option>".
func (c Config) overlayOptionEnv(environ []string) Config {
	prefix := optionEnvPrefix(c.kind())
	for _, kv := range environ {
		name, value, ok := strings.Cut(kv, "=")
		value = strings.TrimSpace(value)
		if prefix == "" || !ok || value == "" || len(name) <= len(prefix) || !strings.HasPrefix(name, prefix) {
			continue
		}
		option := strings.ToLower(name[len(prefix):])
		c.Options, c.envSet = with(c.Options, option, value), with(c.envSet, "options."+option, name)
	}
	return c
}

// with is a copy of m with k set to v: Config values share their maps.
func with(m map[string]string, k, v string) map[string]string {
	if m = maps.Clone(m); m == nil {
		m = map[string]string{}
	}
	m[k] = v
	return m
}
