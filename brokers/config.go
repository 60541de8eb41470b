package brokers

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/claimtx/claimtx/brokers/amqp"
	"github.com/claimtx/claimtx/brokers/internal/defaults"
	"github.com/claimtx/claimtx/brokers/internal/secret"
	"github.com/claimtx/claimtx/brokers/kafka"
	"github.com/claimtx/claimtx/framework"
)

// Built-in kinds.
const (
	KindAMQP      = "amqp"
	KindKafka     = "kafka"
	KindGoChannel = "gochannel"
)

// defaultKind is the kind of a Config whose Kind is empty.
const defaultKind = KindAMQP

// Config selects and configures a broker adapter. The zero value is usable:
// Kind defaults to "amqp" and every adapter field to its documented default.
type Config struct {
	// Kind names the adapter: "amqp" (RabbitMQ), "kafka", "gochannel"
	// (in-process, for tests) or a kind registered with a Registry.
	// Defaults to "amqp".
	Kind string `yaml:"kind"`

	// AMQP configures the "amqp" kind. See brokers/amqp.Config for each
	// field's default.
	AMQP amqp.Config `yaml:"amqp"`

	// Kafka configures the "kafka" kind. See brokers/kafka.Config for each
	// field's default.
	Kafka kafka.Config `yaml:"kafka"`

	// GoChannel configures the "gochannel" kind.
	GoChannel GoChannelConfig `yaml:"gochannel"`

	// Options carries settings for user-registered kinds, which read them
	// in their Factory. The built-in kinds ignore it. ConfigFromEnv and
	// LoadConfigFile set it from the kind's variables (NATS_ACK_WAIT sets
	// "ack_wait" when Kind is "nats"; see the package documentation).
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
	// only is true for ConfigFromEnv: there is no file, so even a field
	// left at its default (a missing KAFKA_CONSUMER_GROUP) is one the user
	// sets through its variable.
	only bool
}

// envVars maps the YAML path of each field an environment variable sets to
// that variable. overlayEnv and error naming both read it.
var envVars = map[string]string{
	"kind":                    envBroker,
	"amqp.url":                envAMQPURL,
	"amqp.concurrency":        envConcurrency,
	"amqp.prefetch":           envAMQPPrefetch,
	"amqp.window":             envAMQPWindow,
	"amqp.nack_delay":         envAMQPNackDelay,
	"amqp.dial_timeout":       envAMQPDialTimeout,
	"kafka.brokers":           envKafkaBrokers,
	"kafka.consumer_group":    envKafkaConsumerGroup,
	"kafka.initial_offset":    envKafkaInitialOffset,
	"kafka.version":           envKafkaVersion,
	"kafka.client_id":         envKafkaClientID,
	"kafka.session_timeout":   envKafkaSessionTimeout,
	"kafka.rebalance_timeout": envKafkaRebalanceTimeout,
	"kafka.nack_delay":        envKafkaNackDelay,
	"kafka.window":            envKafkaWindow,
	"kafka.dial_timeout":      envKafkaDialTimeout,
	"kafka.sasl.mechanism":    envKafkaSASLMechanism,
	"kafka.sasl.user":         envKafkaSASLUser,
	"kafka.sasl.password":     envKafkaSASLPassword,
	"kafka.tls.enabled":       envKafkaTLS,
	"kafka.tls.ca_file":       envKafkaTLSCAFile,
	"kafka.tls.cert_file":     envKafkaTLSCertFile,
	"kafka.tls.key_file":      envKafkaTLSKeyFile,
}

// envField is envVars inverted: the YAML path each variable sets.
var envField = func() map[string]string {
	m := make(map[string]string, len(envVars))
	for field, name := range envVars {
		m[name] = field
	}
	return m
}()

// named returns err with its Field replaced by the environment variable the
// value came from, when it came from one (see envSource). Other errors, and
// fields set in code or a file, are returned unchanged.
func (c Config) named(err error) error {
	var ce *framework.ConfigError
	if !errors.As(err, &ce) {
		return err
	}
	name, ok := c.env.set[ce.Field]
	if !ok && c.env.only {
		name, ok = envVars[ce.Field]
	}
	if !ok && c.env.only {
		// A registered kind's option left unset: name the variable that
		// would set it (see overlayOptionEnv).
		name, ok = c.optionEnvName(ce.Field)
	}
	if !ok {
		return err
	}
	out := *ce
	out.Field = name
	return &out
}

// GoChannelConfig configures the in-process "gochannel" kind. Publishers
// and subscribers built from equal GoChannelConfig values share one
// process-wide Watermill GoChannel, so a publisher and a subscriber made
// from the same Config talk to each other. Nothing leaves the process and
// nothing survives it.
type GoChannelConfig struct {
	// Name separates independent in-process brokers: configs that differ
	// only by Name do not see each other's messages. Defaults to "default".
	Name string `yaml:"name"`

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
// what ConfigFromEnv and LoadConfigFile start from, so the effective
// configuration they return (and print) shows every value.
func defaultConfig() Config {
	k := defaults.Apply(kafka.Config{})
	// Derived from SessionTimeout when zero: leaving it zero lets a file or
	// KAFKA_SESSION_TIMEOUT shorten the session without also having to
	// shorten the heartbeat.
	k.HeartbeatInterval = 0
	return Config{
		Kind:      defaultKind,
		AMQP:      defaults.Apply(amqp.Config{}),
		Kafka:     k,
		GoChannel: GoChannelConfig{}.withDefaults(),
	}
}

func (g GoChannelConfig) withDefaults() GoChannelConfig {
	if g.Name == "" {
		g.Name = "default"
	}
	return g
}

// Validate checks the configuration of a built-in kind (only that kind's
// section: an unused adapter's settings are not looked at) and returns a
// *framework.ConfigError naming the field. Any other kind is only checked
// to be a well-formed name: whether it exists, and its settings, are for
// the Registry that builds it (Registry.NewSubscriber and NewPublisher
// check both). It never panics.
func (c Config) Validate() error {
	kind := c.kind()
	if f, ok := builtinKinds[kind]; ok {
		return c.validateWith(kind, f)
	}
	if !kindPattern.MatchString(kind) {
		return c.named(&framework.ConfigError{
			Field:  "kind",
			Reason: fmt.Sprintf("%q is not a broker kind (built in: %s, %s, %s; a registered kind is lower case letters, digits, '_', '-', '.')", kind, KindAMQP, KindKafka, KindGoChannel),
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

func validateAMQP(c Config) error {
	if err := c.AMQP.Validate(); err != nil {
		return prefixField("amqp", err)
	}
	return nil
}

func validateKafka(c Config) error {
	if err := c.Kafka.Validate(); err != nil {
		return prefixField("kafka", err)
	}
	return nil
}

func validateGoChannel(c Config) error {
	if c.GoChannel.Buffer < 0 {
		return &framework.ConfigError{Field: "gochannel.buffer", Reason: fmt.Sprintf("must not be negative, got %d", c.GoChannel.Buffer)}
	}
	return nil
}

// String prints the config with secrets redacted (the AMQP URL's password,
// the Kafka SASL password, and in Options the value of every key that
// contains "pass", "secret" or "token" and the password of every URL).
func (c Config) String() string {
	return fmt.Sprintf("{Kind:%q AMQP:%s Kafka:%s GoChannel:%+v Options:%v}", c.Kind, c.AMQP, c.Kafka, c.GoChannel, redactOptions(c.Options))
}

// redactOptions returns a copy of opts fit to print: a registered kind's
// Factory cannot redact what Config.String prints, so the rule is here,
// and adapters name their secret options to match it (NATS_PASSWORD,
// NATS_TOKEN). Printing a map sorts its keys.
func redactOptions(opts map[string]string) map[string]string {
	if opts == nil {
		return nil
	}
	out := make(map[string]string, len(opts))
	for k, v := range opts {
		lk := strings.ToLower(k)
		switch {
		case strings.Contains(lk, "pass") || strings.Contains(lk, "secret") || strings.Contains(lk, "token"):
			out[k] = secret.Redact(v)
		case strings.Contains(v, "://"):
			out[k] = secret.RedactURL(v)
		default:
			out[k] = v
		}
	}
	return out
}

// GoString makes %#v redact too.
func (c Config) GoString() string { return "brokers.Config" + c.String() }

// Environment variables read by ConfigFromEnv and LoadConfigFile. See the
// package documentation for what each one sets.
const (
	envBroker                = "BROKER"
	envAMQPURL               = "AMQP_URL"
	envConcurrency           = "CONCURRENCY"
	envAMQPPrefetch          = "AMQP_PREFETCH"
	envAMQPWindow            = "AMQP_WINDOW"
	envAMQPNackDelay         = "AMQP_NACK_DELAY"
	envAMQPDialTimeout       = "AMQP_DIAL_TIMEOUT"
	envKafkaBrokers          = "KAFKA_BROKERS"
	envKafkaConsumerGroup    = "KAFKA_CONSUMER_GROUP"
	envKafkaInitialOffset    = "KAFKA_INITIAL_OFFSET"
	envKafkaVersion          = "KAFKA_VERSION"
	envKafkaClientID         = "KAFKA_CLIENT_ID"
	envKafkaSessionTimeout   = "KAFKA_SESSION_TIMEOUT"
	envKafkaRebalanceTimeout = "KAFKA_REBALANCE_TIMEOUT"
	envKafkaNackDelay        = "KAFKA_NACK_DELAY"
	envKafkaWindow           = "KAFKA_WINDOW"
	envKafkaDialTimeout      = "KAFKA_DIAL_TIMEOUT"
	envKafkaSASLMechanism    = "KAFKA_SASL_MECHANISM"
	envKafkaSASLUser         = "KAFKA_SASL_USER"
	envKafkaSASLPassword     = "KAFKA_SASL_PASSWORD" //nolint:gosec // the variable's name, not a password
	envKafkaTLS              = "KAFKA_TLS"
	envKafkaTLSCAFile        = "KAFKA_TLS_CA_FILE"
	envKafkaTLSCertFile      = "KAFKA_TLS_CERT_FILE"
	envKafkaTLSKeyFile       = "KAFKA_TLS_KEY_FILE"
)

// ConfigFromEnv returns the defaults overlaid with the environment
// variables listed in the package documentation, validated (see
// Config.Validate: a kind that is not built in is checked when a Registry
// builds it). Every field of the result holds its effective value.
func ConfigFromEnv() (Config, error) {
	c, err := defaultConfig().overlayEnv(os.LookupEnv)
	if err != nil {
		return Config{}, err
	}
	c = c.overlayOptionEnv(os.Environ())
	c.env.only = true
	return c, c.Validate()
}

// LoadConfigFile reads a YAML file over the defaults, then overlays the
// environment variables ConfigFromEnv reads (so BROKER=kafka switches a
// file that says amqp), and validates like ConfigFromEnv. Unknown YAML keys
// are errors, so a typo does not silently fall back to a default.
// Durations are written like "500ms".
func LoadConfigFile(path string) (Config, error) {
	data, err := os.ReadFile(path) //nolint:gosec // reading the file the caller names is the point
	if err != nil {
		return Config{}, fmt.Errorf("brokers: read config: %w", err)
	}
	c, err := parseConfig(data)
	if err != nil {
		return Config{}, fmt.Errorf("brokers: config file %s: %w", path, err)
	}
	c, err = c.overlayEnv(os.LookupEnv)
	if err != nil {
		return Config{}, err
	}
	c = c.overlayOptionEnv(os.Environ())
	return c, c.Validate()
}

// parseConfig decodes YAML over defaultConfig without looking at the
// environment and without validating.
func parseConfig(data []byte) (Config, error) {
	c := defaultConfig()
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&c); err != nil && !errors.Is(err, io.EOF) {
		if ce := yamlFieldError(data, err); ce != nil {
			return Config{}, ce
		}
		return Config{}, fmt.Errorf("brokers: parse YAML: %w", err)
	}
	return c, nil
}

// yamlFieldError turns a decode error about one value ("line 3: cannot
// unmarshal !!str `soon` into time.Duration", or an unknown key) into a
// *framework.ConfigError whose Field is that value's YAML path, so a file's
// mistake is named like a Validate one. yaml.v3 reports only a line, so the
// path is the key found on that line. It returns nil for syntax errors,
// which have no field to name. The decoder's message is the Reason, not
// the Err: its Error() repeats every problem of the document.
func yamlFieldError(data []byte, err error) *framework.ConfigError {
	var te *yaml.TypeError
	if !errors.As(err, &te) || len(te.Errors) == 0 {
		return nil
	}
	msg := te.Errors[0]
	var line int
	if _, serr := fmt.Sscanf(msg, "line %d:", &line); serr != nil {
		return nil
	}
	var root yaml.Node
	if yaml.Unmarshal(data, &root) != nil {
		return nil
	}
	paths := map[int]string{}
	var walk func(n *yaml.Node, path string)
	walk = func(n *yaml.Node, path string) {
		switch n.Kind {
		case yaml.DocumentNode:
			for _, c := range n.Content {
				walk(c, path)
			}
		case yaml.MappingNode:
			for i := 0; i+1 < len(n.Content); i += 2 {
				p := n.Content[i].Value
				if path != "" {
					p = path + "." + p
				}
				if _, seen := paths[n.Content[i].Line]; !seen {
					paths[n.Content[i].Line] = p
				}
				walk(n.Content[i+1], p)
			}
		case yaml.SequenceNode:
			for _, c := range n.Content {
				if _, seen := paths[c.Line]; !seen && path != "" {
					paths[c.Line] = path
				}
				walk(c, path)
			}
		case yaml.ScalarNode, yaml.AliasNode:
			if _, seen := paths[n.Line]; !seen && path != "" {
				paths[n.Line] = path
			}
		}
	}
	walk(&root, "")
	field, ok := paths[line]
	if !ok || field == "" {
		// An empty key ("": 1) has no path to name: report the decoder's
		// message as a parse error.
		return nil
	}
	reason := strings.TrimSpace(strings.TrimPrefix(msg, fmt.Sprintf("line %d:", line)))
	return &framework.ConfigError{Field: field, Reason: fmt.Sprintf("%s (line %d)", reason, line)}
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
	set := make(map[string]string, len(c.env.set)+len(envVars))
	for field, name := range c.env.set {
		set[field] = name
	}
	get := func(name string) (string, bool) {
		v, ok := lookup(name)
		v = strings.TrimSpace(v)
		if !ok || v == "" {
			return "", false
		}
		set[envField[name]] = name
		return v, true
	}
	var firstErr error
	fail := func(name, reason string) {
		if firstErr == nil {
			firstErr = &framework.ConfigError{Field: name, Reason: reason}
		}
	}
	str := func(name string, dst *string) {
		if v, ok := get(name); ok {
			*dst = v
		}
	}
	posInt := func(name string, dst *int) {
		if v, ok := get(name); ok {
			n, err := strconv.Atoi(v)
			if err != nil || n <= 0 {
				fail(name, fmt.Sprintf("must be a positive integer, got %q", v))
				return
			}
			*dst = n
		}
	}
	dur := func(name string, dst *time.Duration) {
		if v, ok := get(name); ok {
			d, err := time.ParseDuration(v)
			if err != nil {
				fail(name, fmt.Sprintf("must be a duration like 500ms or 2s, got %q", v))
				return
			}
			*dst = d
		}
	}
	boolean := func(name string, dst *bool) {
		if v, ok := get(name); ok {
			b, err := strconv.ParseBool(v)
			if err != nil {
				fail(name, fmt.Sprintf("must be true or false, got %q", v))
				return
			}
			*dst = b
		}
	}

	str(envBroker, &c.Kind)

	if v, ok := get(envAMQPURL); ok {
		c.AMQP.URL = v // never echoed back in errors: it may hold a password
	}
	posInt(envConcurrency, &c.AMQP.Concurrency)
	posInt(envAMQPPrefetch, &c.AMQP.Prefetch)
	posInt(envAMQPWindow, &c.AMQP.Window)
	dur(envAMQPNackDelay, &c.AMQP.NackDelay)
	dur(envAMQPDialTimeout, &c.AMQP.DialTimeout)

	if v, ok := get(envKafkaBrokers); ok {
		var list []string
		for _, b := range strings.Split(v, ",") {
			if b = strings.TrimSpace(b); b != "" {
				list = append(list, b)
			}
		}
		if len(list) == 0 {
			fail(envKafkaBrokers, "must list at least one host:port")
		} else {
			c.Kafka.Brokers = list
		}
	}
	str(envKafkaConsumerGroup, &c.Kafka.ConsumerGroup)
	str(envKafkaInitialOffset, &c.Kafka.InitialOffset)
	str(envKafkaVersion, &c.Kafka.Version)
	str(envKafkaClientID, &c.Kafka.ClientID)
	dur(envKafkaSessionTimeout, &c.Kafka.SessionTimeout)
	dur(envKafkaRebalanceTimeout, &c.Kafka.RebalanceTimeout)
	dur(envKafkaNackDelay, &c.Kafka.NackDelay)
	posInt(envKafkaWindow, &c.Kafka.Window)
	dur(envKafkaDialTimeout, &c.Kafka.DialTimeout)
	str(envKafkaSASLMechanism, &c.Kafka.SASL.Mechanism)
	str(envKafkaSASLUser, &c.Kafka.SASL.User)
	if v, ok := get(envKafkaSASLPassword); ok {
		c.Kafka.SASL.Password = v
	}
	boolean(envKafkaTLS, &c.Kafka.TLS.Enabled)
	str(envKafkaTLSCAFile, &c.Kafka.TLS.CAFile)
	str(envKafkaTLSCertFile, &c.Kafka.TLS.CertFile)
	str(envKafkaTLSKeyFile, &c.Kafka.TLS.KeyFile)

	if firstErr != nil {
		return Config{}, firstErr
	}
	c.env.set = set
	return c, nil
}

// optionEnvPrefix is the prefix of the environment variables that set the
// Options of kind: the kind in upper case with '.' and '-' as '_', then
// '_' ("nats" -> "NATS_", "my-bus" -> "MY_BUS_"). Built-in kinds have
// their own variables and no prefix ("").
func optionEnvPrefix(kind string) string {
	switch kind {
	case KindAMQP, KindKafka, KindGoChannel: // not builtinKinds: it refers to named, which calls this
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
// set: BROKER=nats with NATS_ACK_WAIT=5s sets Options["ack_wait"]. This is
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
			// Copies: Config values share their maps.
			opts = make(map[string]string, len(c.Options)+1)
			for k, v := range c.Options {
				opts[k] = v
			}
			set = make(map[string]string, len(c.env.set)+1)
			for k, v := range c.env.set {
				set[k] = v
			}
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
