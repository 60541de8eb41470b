package brokers

import (
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

// defaultKind is the kind of a Config whose Kind is empty.
const defaultKind = KindAMQP

// Config selects and configures a broker adapter. The zero value is usable:
// Kind defaults to "amqp" and every adapter field to its documented default.
// Each built-in adapter has its section, of a type of this package
// (AMQPConfig, KafkaConfig, NATSConfig), so that a Config carries them all
// while a program links only the adapters it imports.
type Config struct {
	// Kind names the adapter: "amqp" (RabbitMQ), "kafka", "nats",
	// "gochannel" (in-process, for tests) or a kind registered with
	// Register. Defaults to "amqp".
	Kind string `yaml:"kind" env:"BROKER" default:"amqp"`

	// AMQP configures the "amqp" kind (brokers/amqp). See AMQPConfig for
	// each field's default.
	AMQP AMQPConfig `yaml:"amqp"`

	// Kafka configures the "kafka" kind (brokers/kafka). See KafkaConfig
	// for each field's default.
	Kafka KafkaConfig `yaml:"kafka"`

	// NATS configures the "nats" kind (brokers/nats). See NATSConfig for
	// each field's default.
	NATS NATSConfig `yaml:"nats"`

	// GoChannel configures the "gochannel" kind.
	GoChannel GoChannelConfig `yaml:"gochannel"`

	// Options carries settings for user-registered kinds, which read them
	// in their Factory. The built-in kinds ignore it. LoadConfig("") and
	// LoadConfig set it from the kind's variables (MY_BUS_REGION sets
	// "region" when Kind is "my-bus"; see the package documentation).
	// Defaults to none.
	Options map[string]string `yaml:"options"`

	// env remembers which fields overlayEnv set, so that errors name the
	// variable the user wrote instead of a YAML path they never saw.
	env envSource
}

// kind is c.Kind with its default applied.
func (c Config) kind() string {
	if c.Kind == "" {
		return defaultKind
	}
	return c.Kind
}

// envSource is where a Config's values came from.
type envSource struct {
	// set maps the YAML path of each field overlayEnv set to its variable.
	// Shared between copies of a Config: overlayEnv replaces it, never
	// writes to it.
	set map[string]string
	// only is true for LoadConfig(""): there is no file, so even a field
	// left at its default (a missing KAFKA_CONSUMER_GROUP) is one the user
	// sets through its variable.
	only bool
}

// envSettings are the variables that override a file, in the order they
// are applied, as the env tags of Config's fields declare them.
var envSettings = config.Settings[Config]()

// envVars maps the YAML path of each field a variable sets to that
// variable, to name errors about a field nobody set (see named).
var envVars = func() map[string]string {
	m := make(map[string]string, len(envSettings))
	for _, s := range envSettings {
		m[s.Path] = s.Env
	}
	return m
}()

// named returns err with its Field replaced by the environment variable the
// value came from, when it came from one (see envSource). Other errors, and
// fields set in code or a file, are returned unchanged.
func (c Config) named(err error) error {
	return config.Rename(err, func(field string) (string, bool) {
		if name, ok := c.env.set[field]; ok || !c.env.only {
			return name, ok
		}
		if name, ok := envVars[field]; ok {
			return name, true
		}
		// A registered kind's option left unset: name the variable that
		// would set it (see overlayOptionEnv).
		return c.optionEnvName(field)
	})
}

// GoChannelConfig configures the in-process "gochannel" kind. Publishers
// and subscribers built from equal GoChannelConfig values share one
// process-wide Watermill GoChannel, so a publisher and a subscriber made
// from the same Config talk to each other. Nothing leaves the process and
// nothing survives it.
type GoChannelConfig struct {
	// Name separates independent in-process brokers: configs that differ
	// only by Name do not see each other's messages. Defaults to "default".
	Name string `yaml:"name" default:"default"`

	// Buffer is the output channel buffer of each subscription.
	// Defaults to 0 (unbuffered).
	Buffer int64 `yaml:"buffer"`

	// Persistent keeps every published message in memory and replays it to
	// subscribers that arrive later, like a durable queue. Memory grows with
	// every message. Defaults to false: a message published while no one
	// subscribes to its topic is dropped.
	Persistent bool `yaml:"persistent"`

	// BlockPublishUntilSubscriberAck makes Publish wait until every
	// subscriber acked the message. Defaults to false.
	BlockPublishUntilSubscriberAck bool `yaml:"block_publish_until_subscriber_ack"`
}

// defaultConfig returns a Config with every default written out, which is
// what LoadConfig starts from, so the effective configuration it returns
// (and prints) shows every value. Kafka's HeartbeatInterval stays zero, to
// be derived from SessionTimeout: that lets a file or
// KAFKA_SESSION_TIMEOUT shorten the session without also having to
// shorten the heartbeat.
func defaultConfig() Config { return config.Defaults(Config{}) }

// Validate checks c as NewSubscriber and NewPublisher will, without
// building anything, and returns a *framework.ConfigError naming the
// field: the section of Config the selected kind reads (amqp, kafka or
// gochannel; an unused adapter's settings are not looked at), that the
// kind is linked into the program (see Register), and the kind's own
// Factory.Validate. Call it before connecting anywhere, after filling in
// what the program sets itself (a registered kind's options), so a
// misspelt BROKER fails at once. It never panics.
func (c Config) Validate() error {
	_, _, err := factory(c)
	return err
}

// check is what LoadConfig checks: the section of Config the selected kind
// reads, with the checks of its adapter when that is linked. Any other
// kind is only checked to be a well-formed name, because the program may
// still fill in its options (or link it in a binary that only reads the
// configuration): whether it exists, and its options, are for Validate,
// NewSubscriber and NewPublisher.
func (c Config) check() error {
	kind := c.kind()
	if check, ok := sections[kind]; ok {
		if err := check(c); err != nil {
			return c.named(err)
		}
		if f, ok := linkedFactory(kind); ok {
			return c.validateWith(kind, f) // what only the adapter's client can tell
		}
		return nil
	}
	if !kindPattern.MatchString(kind) {
		return c.named(&framework.ConfigError{
			Field:  "kind",
			Reason: fmt.Sprintf("%q is not a broker kind (built in: %s, %s, %s, %s; a registered kind is lower case letters, digits, '_', '-', '.')", kind, KindAMQP, KindKafka, KindNATS, KindGoChannel),
			Err:    ErrInvalidKind,
		})
	}
	return nil
}

// validateWith runs f.Validate, the checks of kind, on c. An error that is
// not a *framework.ConfigError is reported as field "options", where
// registered kinds keep their settings.
func (c Config) validateWith(kind string, f Factory) error {
	if f.Validate == nil {
		return nil
	}
	err := f.Validate(c)
	if err == nil {
		return nil
	}
	var ce *framework.ConfigError
	if errors.As(err, &ce) {
		return c.named(err)
	}
	return &framework.ConfigError{Field: "options", Reason: fmt.Sprintf("refused by broker kind %q", kind), Err: err}
}

// sections are the checks of the settings Config holds for a kind, run
// whether or not the kind's adapter is linked.
var sections = map[string]func(Config) error{
	KindAMQP:      func(c Config) error { return prefixField(KindAMQP, c.AMQP.Validate()) },
	KindKafka:     func(c Config) error { return prefixField(KindKafka, c.Kafka.Validate()) },
	KindNATS:      func(c Config) error { return prefixField(KindNATS, c.NATS.validate()) },
	KindGoChannel: validateGoChannel,
}

func validateGoChannel(c Config) error {
	if c.GoChannel.Buffer < 0 {
		return &framework.ConfigError{Field: "gochannel.buffer", Reason: fmt.Sprintf("must not be negative, got %d", c.GoChannel.Buffer)}
	}
	return nil
}

// String prints the config with secrets redacted (the AMQP and NATS URLs'
// passwords, the Kafka SASL password, the NATS password and token, and in
// Options the value of every key that contains "pass", "secret" or "token"
// and the password of every URL).
func (c Config) String() string {
	return fmt.Sprintf("{Kind:%q AMQP:%s Kafka:%s NATS:%s GoChannel:%+v Options:%v}", c.Kind, c.AMQP, c.Kafka, c.NATS, c.GoChannel, redactOptions(c.Options))
}

// redactOptions returns a copy of opts fit to print: a registered kind's
// Factory cannot redact what Config.String prints, so the rule is here,
// and adapters name their secret options to match it (MY_BUS_PASSWORD,
// MY_BUS_TOKEN). Printing a map sorts its keys.
func redactOptions(opts map[string]string) map[string]string {
	if opts == nil {
		return nil
	}
	out := make(map[string]string, len(opts))
	for k, v := range opts {
		lk := strings.ToLower(k)
		switch {
		case strings.Contains(lk, "pass") || strings.Contains(lk, "secret") || strings.Contains(lk, "token"):
			out[k] = config.Redact(v)
		case strings.Contains(v, "://"):
			out[k] = config.RedactURL(v)
		default:
			out[k] = v
		}
	}
	return out
}

// GoString makes %#v redact too.
func (c Config) GoString() string { return "brokers.Config" + c.String() }

// LoadConfig returns the defaults, overlaid with the YAML file at path
// (none when path is ""), overlaid with the environment variables listed
// in the package documentation (so BROKER=kafka switches a file that says
// amqp), checked (a kind that is not built in only for being a well-formed
// name: Config.Validate, NewSubscriber and NewPublisher check the rest).
// Every field of the result holds its
// effective value. Unknown YAML keys are errors, so a typo does not
// silently fall back to a default; durations are written like "500ms".
// Errors name the field by its YAML path ("amqp.url"), or by the variable
// when the value came from one or, without a file, would.
func LoadConfig(path string) (Config, error) {
	if path == "" {
		c := defaultConfig()
		c.env.only = true
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

// framework/consumer reads the "broker:" section of its file so.
func init() {
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

// parseConfig decodes YAML over defaultConfig without looking at the
// environment and without validating.
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

// overlayEnv returns c with every set variable applied, reading variables
// through lookup (os.LookupEnv when nil; a map in tests). A variable that is
// set but empty counts as unset. A value that does not parse is a
// *framework.ConfigError whose Field is the variable. The result is not
// validated; when it is, errors about a field a variable set name the
// variable too.
func (c Config) overlayEnv(lookup func(string) (string, bool)) (Config, error) {
	if lookup == nil {
		lookup = os.LookupEnv
	}
	// Each variable found is recorded as the source of its field, so that
	// Validate names the variable rather than the YAML path.
	set := cloned(c.env.set)
	err := config.ApplyEnv(&c, envSettings, lookup, func(s config.Setting[Config], name string) { set[s.Path] = name })
	if err != nil {
		return Config{}, err
	}
	c.env.set = set
	return c, nil
}

// optionEnvPrefix is the prefix of the environment variables that set the
// Options of kind: the kind in upper case with '.' and '-' as '_', then
// '_' ("my-bus" -> "MY_BUS_", "bus.v2" -> "BUS_V2_"). Built-in kinds have
// their own variables and no prefix ("").
func optionEnvPrefix(kind string) string {
	if _, ok := sections[kind]; ok { // built in: their settings have their own variables
		return ""
	}
	if !kindPattern.MatchString(kind) {
		return ""
	}
	return strings.ToUpper(strings.NewReplacer(".", "_", "-", "_").Replace(kind)) + "_"
}

// overlayOptionEnv returns c with every variable of environ ("NAME=value")
// named <prefix><OPTION> (see optionEnvPrefix) copied into
// Options["<option>"], the option name in lower case, over what a file
// set: BROKER=my-bus with MY_BUS_REGION=eu sets Options["region"]. This is
// how a registered kind is configured from the environment like the
// built-in ones, without claimtx knowing its settings; which options
// exist, and whether an unknown one is an error, is up to its Factory. A
// variable set but empty counts as unset. Each one is recorded as the
// source of "options.<option>", so errors about that field name the
// variable.
func (c Config) overlayOptionEnv(environ []string) Config {
	prefix := optionEnvPrefix(c.kind())
	if prefix == "" {
		return c
	}
	var opts, set map[string]string
	for _, kv := range environ {
		name, value, ok := strings.Cut(kv, "=")
		value = strings.TrimSpace(value)
		if !ok || value == "" || len(name) <= len(prefix) || !strings.HasPrefix(name, prefix) {
			continue
		}
		if opts == nil {
			opts, set = cloned(c.Options), cloned(c.env.set)
		}
		option := strings.ToLower(name[len(prefix):])
		opts[option] = value
		set["options."+option] = name
	}
	if opts != nil {
		c.Options, c.env.set = opts, set
	}
	return c
}

// cloned is a copy of m to write to: Config values share their maps.
func cloned(m map[string]string) map[string]string {
	if m == nil {
		return map[string]string{}
	}
	return maps.Clone(m)
}

// optionEnvName returns the variable that sets field when field is
// "options.<option>" of a registered kind.
func (c Config) optionEnvName(field string) (string, bool) {
	option, ok := strings.CutPrefix(field, "options.")
	prefix := optionEnvPrefix(c.kind())
	if !ok || option == "" || prefix == "" {
		return "", false
	}
	return prefix + strings.ToUpper(option), true
}
