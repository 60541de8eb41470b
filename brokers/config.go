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

	"github.com/claimtx/claimtx/brokers/internal/secret"
	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/internal/yamlpath"
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

	// AMQP configures the "amqp" kind (brokers/amqp). See AMQPConfig for
	// each field's default.
	AMQP AMQPConfig `yaml:"amqp"`

	// Kafka configures the "kafka" kind (brokers/kafka). See KafkaConfig
	// for each field's default.
	Kafka KafkaConfig `yaml:"kafka"`

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
	"amqp.queue_type":         envAMQPQueueType,
	"amqp.delivery_limit":     envAMQPDeliveryLimit,
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
	k := KafkaConfig{}.withDefaults()
	// Derived from SessionTimeout when zero: leaving it zero lets a file or
	// KAFKA_SESSION_TIMEOUT shorten the session without also having to
	// shorten the heartbeat.
	k.HeartbeatInterval = 0
	return Config{
		Kind:      defaultKind,
		AMQP:      AMQPConfig{}.withDefaults(),
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

// Validate checks the configuration of the selected kind and returns a
// *framework.ConfigError naming the field: the kind's section for amqp,
// kafka and gochannel (an unused adapter's settings are not looked at),
// then the Factory.Validate of a kind linked with Register. A kind neither
// linked nor built in is only checked to be a well-formed name: whether it
// exists, and its settings, are for the Registry that builds it
// (Registry.NewSubscriber and NewPublisher check both). It never panics.
func (c Config) Validate() error {
	kind := c.kind()
	if check, ok := sections[kind]; ok {
		if err := check(c); err != nil {
			return c.named(err)
		}
	}
	if f, ok := linkedFactory(kind); ok {
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

// sections are the checks of the settings Config holds for a kind, run
// whether or not the kind's adapter is linked.
var sections = map[string]func(Config) error{
	KindAMQP:      validateAMQP,
	KindKafka:     validateKafka,
	KindGoChannel: validateGoChannel,
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
	envAMQPQueueType         = "AMQP_QUEUE_TYPE"
	envAMQPDeliveryLimit     = "AMQP_DELIVERY_LIMIT"
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

// fileSuffix names the variable that holds the path of a file with a
// secret's value instead of the value (AMQP_URL_FILE for AMQP_URL,
// KAFKA_SASL_PASSWORD_FILE), the convention of Docker and Kubernetes
// secrets mounted as files. A file keeps the secret out of the process
// environment, which other processes of the same user can read
// (/proc/PID/environ) and crash reporters collect.
const fileSuffix = "_FILE"

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
	return c.withEnv()
}

// LoadConfig is LoadConfigFile for YAML already read, such as the broker
// section of a larger configuration file (framework/consumer.LoadConfig
// reads its "broker:" section with it): the defaults, the YAML over them,
// the environment over that, validated. Errors name the field by its YAML
// path within data ("amqp.url"), or the variable when the value came from
// one.
func LoadConfig(data []byte) (Config, error) {
	c, err := parseConfig(data)
	if err != nil {
		return Config{}, err
	}
	return c.withEnv()
}

// withEnv is c with the environment over it, validated.
func (c Config) withEnv() (Config, error) {
	c, err := c.overlayEnv(os.LookupEnv)
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

// yamlFieldError turns a decode error about one value into a
// *framework.ConfigError naming its YAML path (see yamlpath.FieldError), or
// nil for syntax errors.
func yamlFieldError(data []byte, err error) *framework.ConfigError {
	return yamlpath.FieldError(data, err)
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

	// secret reads a secret from its variable or from the file its _FILE
	// variable names. Neither the value nor the file's content is ever
	// echoed back in errors; a field set from the file is named by the
	// _FILE variable in Validate errors.
	secret := func(name string, dst *string) {
		v, ok := get(name)
		fileName := name + fileSuffix
		path, fromFile := lookup(fileName)
		path = strings.TrimSpace(path)
		switch {
		case fromFile && path != "" && ok:
			fail(fileName, fmt.Sprintf("set %s or %s, not both", name, fileName))
			return
		case fromFile && path != "":
			data, err := os.ReadFile(path) //nolint:gosec // reading the file the operator names is the point
			if err != nil {
				// *fs.PathError names the path and the cause, never the content.
				fail(fileName, fmt.Sprintf("cannot read the file: %v", err))
				return
			}
			// A trailing newline is what editors and `echo` leave behind.
			if v = strings.TrimSpace(string(data)); v == "" {
				fail(fileName, fmt.Sprintf("the file %s is empty", path))
				return
			}
			set[envField[name]] = fileName
			ok = true
		}
		if ok {
			*dst = v
		}
	}

	secret(envAMQPURL, &c.AMQP.URL)
	posInt(envConcurrency, &c.AMQP.Concurrency)
	posInt(envAMQPPrefetch, &c.AMQP.Prefetch)
	posInt(envAMQPWindow, &c.AMQP.Window)
	dur(envAMQPNackDelay, &c.AMQP.NackDelay)
	dur(envAMQPDialTimeout, &c.AMQP.DialTimeout)
	str(envAMQPQueueType, &c.AMQP.QueueType)
	posInt(envAMQPDeliveryLimit, &c.AMQP.DeliveryLimit)

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
	secret(envKafkaSASLPassword, &c.Kafka.SASL.Password)
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
	case KindAMQP, KindKafka, KindGoChannel: // their settings have their own variables
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
