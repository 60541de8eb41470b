package brokers

import (
	"fmt"
	"net/url"
	"os"
	"regexp"
	"strings"
	"time"

	"github.com/claimtx/claimtx/brokers/internal/defaults"
	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/internal/config"
)

// natsDurablePattern is what JetStream accepts as a durable name (a token
// of the consumer's API subjects: no '.', '*', '>' or whitespace).
var natsDurablePattern = regexp.MustCompile(`^[A-Za-z0-9_-]{1,200}$`)

// NATSConfig configures the NATS JetStream adapter (brokers/nats, whose
// package documentation tells what each setting does). Every zero field
// takes its default; the URL's password, Password and Token are redacted
// whenever it is printed.
type NATSConfig struct {
	// URL is the server, nats://host:port (or tls://, ws://, wss://), comma
	// separated for a cluster. Its password is redacted when printed; a
	// token written as its user (nats://token@host) is not: use Token.
	// Defaults to "nats://127.0.0.1:4222".
	URL string `yaml:"url" env:"NATS_URL,secret" default:"nats://127.0.0.1:4222"`
	// User and Password authenticate with a user name; Password needs
	// User. Default to "".
	User     string `yaml:"user" env:"NATS_USER"`
	Password string `yaml:"password" env:"NATS_PASSWORD,secret"`
	// Token authenticates with a token, not with User. Defaults to "".
	Token string `yaml:"token" env:"NATS_TOKEN,secret"`
	// CredsFile is a .creds file (JWT and NKey seed). Defaults to "".
	CredsFile string `yaml:"creds_file" env:"NATS_CREDS_FILE"`
	// Durable is the JetStream durable consumer every Subscribe uses, one
	// per service, required by NewSubscriber. No default, as for Kafka's
	// consumer group; framework/consumer defaults it to the consumer's
	// Name when that is a durable name.
	Durable string `yaml:"durable" env:"NATS_DURABLE"`
	// SubjectPrefix is put before every topic: subject = prefix + topic.
	// Defaults to "".
	SubjectPrefix string `yaml:"subject_prefix" env:"NATS_SUBJECT_PREFIX"`
	// AckWait is how long JetStream waits for an ack before it redelivers;
	// a message in progress is extended every AckWait/2. At least 1s.
	// Defaults to 30s.
	AckWait time.Duration `yaml:"ack_wait" env:"NATS_ACK_WAIT" default:"30s"`
	// MaxDeliver is how many times JetStream delivers a message before it
	// silently stops (see the brokers/nats documentation, "MaxDeliver").
	// -1 is unlimited. Defaults to -1.
	MaxDeliver int `yaml:"max_deliver" env:"NATS_MAX_DELIVER,nonzero" default:"-1"`
	// MaxAckPending caps the messages delivered and not yet acked across
	// every replica of the durable. Defaults to 256.
	MaxAckPending int `yaml:"max_ack_pending" env:"NATS_MAX_ACK_PENDING,positive" default:"256"`
	// NackDelay is how long JetStream holds a nacked message before it
	// redelivers it. Negative: no delay. Defaults to 1s.
	NackDelay time.Duration `yaml:"nack_delay" env:"NATS_NACK_DELAY" default:"1s"`
	// Concurrency is how many messages one Subscribe call processes at
	// once (one pull subscription each). Defaults to 4.
	Concurrency int `yaml:"concurrency" env:"NATS_CONCURRENCY,positive" default:"4"`
	// Streams is "create" (a subject no stream captures gets a stream of
	// its own) or "require" (it is an error). Defaults to "create".
	Streams string `yaml:"streams" env:"NATS_STREAMS" default:"create"`
	// DialTimeout bounds the start-up connection attempts. Negative: a
	// single attempt. Defaults to 30s.
	DialTimeout time.Duration `yaml:"dial_timeout" env:"NATS_DIAL_TIMEOUT" default:"30s"`
}

// The adapter applies the same defaults (defaults.Apply).
func init() { defaults.Register(NATSConfig.withDefaults) }

func (c NATSConfig) withDefaults() NATSConfig {
	c = config.Defaults(c)
	c.Streams = strings.ToLower(c.Streams)
	return c
}

// validate is AMQPConfig.Validate for NATS, which is only used within a
// Config. It never quotes a value that may hold a secret. Whether
// SubjectPrefix makes a NATS subject is the adapter's check.
func (c NATSConfig) validate() error {
	c = c.withDefaults()
	for _, one := range strings.Split(c.URL, ",") {
		u, err := url.Parse(strings.TrimSpace(one))
		switch {
		case err != nil:
			return fieldErr("url", "is not a URL")
		case u.Scheme != "nats" && u.Scheme != "tls" && u.Scheme != "ws" && u.Scheme != "wss":
			return fieldErr("url", "must be nats://host:port (or tls://, ws://, wss://), comma separated for a cluster")
		case u.Host == "":
			return fieldErr("url", "has no host")
		}
	}
	err := firstError(
		when(c.Password != "" && c.User == "", "user", "is required with password"),
		when(c.Token != "" && c.User != "", "token", "cannot be combined with user/password"),
		when(c.Durable != "" && !natsDurablePattern.MatchString(c.Durable), "durable", "must be 1-200 letters, digits, '_' or '-' (a JetStream durable name), got %q", c.Durable),
		when(c.Streams != "create" && c.Streams != "require", "streams", "must be %q or %q, got %q", "create", "require", c.Streams),
		// In-progress signals go every half ack wait: below a second they
		// would be most of the traffic.
		when(c.AckWait < time.Second, "ack_wait", "must be at least 1s, got %s", c.AckWait),
		when(c.MaxDeliver < -1, "max_deliver", "must be -1 (unlimited) or a positive integer, got %d", c.MaxDeliver),
		when(c.MaxAckPending < 1 || c.MaxAckPending > 1<<20, "max_ack_pending", "must be an integer from 1 to %d, got %d", 1<<20, c.MaxAckPending),
		when(c.Concurrency < 1 || c.Concurrency > 4096, "concurrency", "must be an integer from 1 to %d, got %d", 4096, c.Concurrency),
	)
	if err != nil {
		return err
	}
	if c.CredsFile != "" {
		if _, err := os.Stat(c.CredsFile); err != nil {
			return &framework.ConfigError{Field: "creds_file", Reason: "cannot be read", Err: err}
		}
	}
	return nil
}

// String prints the config with the URL's password, Password and Token
// redacted.
func (c NATSConfig) String() string { return config.Format(c) }

// GoString makes %#v redact too.
func (c NATSConfig) GoString() string { return "brokers.NATSConfig" + c.String() }

// checkNATSEnv refuses the first set NATS_ variable of environ that sets no
// field, so a typo (NATS_ACKWAIT) does not silently leave a default.
func checkNATSEnv(environ []string) error {
	known := map[string]bool{}
	var list []string
	for _, s := range envSettings {
		if strings.HasPrefix(s.Env, "NATS_") {
			known[s.Env] = true
			if s.Secret {
				known[s.Env+config.FileSuffix] = true
			}
			list = append(list, s.Env)
		}
	}
	for _, kv := range environ {
		name, value, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(name, "NATS_") && !known[name] && strings.TrimSpace(value) != "" {
			return &framework.ConfigError{Field: name, Reason: fmt.Sprintf("unknown variable of broker kind %q (known: %s)", KindNATS, strings.Join(list, ", "))}
		}
	}
	return nil
}
