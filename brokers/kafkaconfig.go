package brokers

import (
	"fmt"
	"net"
	"regexp"
	"strings"
	"time"

	"github.com/claimtx/claimtx/brokers/internal/defaults"
	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/internal/config"
)

// kafkaVersionPattern is what sarama.ParseKafkaVersion accepts: X.Y.Z, or
// 0.X.Y.Z before Kafka 1.0.
var kafkaVersionPattern = regexp.MustCompile(`^(0\.\d+\.\d+\.\d+|[1-9]\d*\.\d+\.\d+)$`)

// KafkaConfig configures the Kafka adapter (brokers/kafka, whose package
// documentation tells what each setting does). Every zero field takes its default.
type KafkaConfig struct {
	// Brokers are the bootstrap addresses (host:port).
	// Defaults to ["127.0.0.1:9092"].
	Brokers []string `yaml:"brokers" env:"KAFKA_BROKERS" default:"127.0.0.1:9092"`
	// ConsumerGroup is the group every Subscribe joins, required by
	// NewSubscriber. No default: two services sharing one would split the
	// topic's partitions. framework/consumer defaults it to the consumer's Name.
	ConsumerGroup string `yaml:"consumer_group" env:"KAFKA_CONSUMER_GROUP"`
	// InitialOffset is where a group without a committed offset starts:
	// "oldest" (loses nothing) or "newest". Defaults to "oldest".
	InitialOffset string `yaml:"initial_offset" env:"KAFKA_INITIAL_OFFSET" default:"oldest"`
	// Version is the protocol version the publisher (Sarama) speaks, as
	// "X.Y.Z"; the subscriber negotiates. Defaults to "3.6.0".
	Version string `yaml:"version" env:"KAFKA_VERSION" default:"3.6.0"`
	// ClientID is sent with every request. Defaults to "claimtx".
	ClientID string `yaml:"client_id" env:"KAFKA_CLIENT_ID" default:"claimtx"`
	// MaxWaitTime is how long a fetch waits on the broker for data, and so
	// how long the end of a subscription can wait. Defaults to 100ms.
	MaxWaitTime time.Duration `yaml:"max_wait_time" default:"100ms"`
	// SessionTimeout is how long a member may miss heartbeats before its
	// partitions go to the others. Defaults to 10s.
	SessionTimeout time.Duration `yaml:"session_timeout" env:"KAFKA_SESSION_TIMEOUT" default:"10s"`
	// HeartbeatInterval is how often a member heartbeats, below
	// SessionTimeout. Defaults to SessionTimeout/3.
	HeartbeatInterval time.Duration `yaml:"heartbeat_interval"`
	// RebalanceTimeout is how long the coordinator waits for members to
	// rejoin; group requests wait this plus 10s. At least SessionTimeout.
	// Defaults to 60s.
	RebalanceTimeout time.Duration `yaml:"rebalance_timeout" env:"KAFKA_REBALANCE_TIMEOUT" default:"60s"`
	// CommitInterval is how often acked offsets are committed: up to this
	// much acked work is redelivered after a crash. Defaults to 1s.
	CommitInterval time.Duration `yaml:"commit_interval" default:"1s"`
	// NackDelay is the wait before a nacked message is re-sent (Kafka
	// cannot requeue one). Negative: no delay. Defaults to 1s.
	NackDelay time.Duration `yaml:"nack_delay" env:"KAFKA_NACK_DELAY" default:"1s"`
	// Window is how many messages per partition are handed out before
	// earlier ones are acked (for a batch consumer: at least the batch
	// size). Defaults to 0, which means one.
	Window int `yaml:"window" env:"KAFKA_WINDOW,positive"`
	// DialTimeout bounds how long NewPublisher and the first Subscribe
	// retry while no broker is reachable. Negative: a single attempt.
	// Defaults to 30s.
	DialTimeout time.Duration `yaml:"dial_timeout" env:"KAFKA_DIAL_TIMEOUT" default:"30s"`
	// ReconnectBackoff is the wait between those attempts, and between
	// polls while every fetch fails. Defaults to 1s.
	ReconnectBackoff time.Duration `yaml:"reconnect_backoff" default:"1s"`
	// TLS enables TLS to the brokers.
	TLS KafkaTLSConfig `yaml:"tls"`
	// SASL enables SASL authentication.
	SASL KafkaSASLConfig `yaml:"sasl"`
}

// KafkaTLSConfig is the TLS both clients use.
type KafkaTLSConfig struct {
	// Enabled turns TLS on; the system roots verify the brokers unless
	// CAFile is set. Defaults to false.
	Enabled bool `yaml:"enabled" env:"KAFKA_TLS"`
	// CAFile is a PEM file of CA certificates to trust. Defaults to "".
	CAFile string `yaml:"ca_file" env:"KAFKA_TLS_CA_FILE"`
	// CertFile and KeyFile are the client certificate and key (PEM) for
	// mutual TLS. Both or neither. Default to "".
	CertFile string `yaml:"cert_file" env:"KAFKA_TLS_CERT_FILE"`
	KeyFile  string `yaml:"key_file" env:"KAFKA_TLS_KEY_FILE"`
	// ServerName overrides the name verified in the brokers' certificates.
	// Defaults to the host of each broker address.
	ServerName string `yaml:"server_name"`
	// InsecureSkipVerify disables certificate verification: only for local
	// experiments. Defaults to false.
	InsecureSkipVerify bool `yaml:"insecure_skip_verify"`
}

// KafkaSASLConfig is the SASL both clients use.
type KafkaSASLConfig struct {
	// Mechanism is "PLAIN" (use it with TLS), "SCRAM-SHA-256" or
	// "SCRAM-SHA-512"; empty disables SASL. Defaults to "".
	Mechanism string `yaml:"mechanism" env:"KAFKA_SASL_MECHANISM"`
	// User is the SASL user name. Defaults to "".
	User string `yaml:"user" env:"KAFKA_SASL_USER"`
	// Password is the SASL password, redacted whenever the config is
	// printed. Defaults to "".
	Password string `yaml:"password" env:"KAFKA_SASL_PASSWORD,secret"`
}

// String prints the SASL settings with the password redacted.
func (s KafkaSASLConfig) String() string { return config.Format(s) }

// GoString makes %#v redact too.
func (s KafkaSASLConfig) GoString() string { return "brokers.KafkaSASLConfig" + s.String() }

// The adapter applies the same defaults (defaults.Apply).
func init() { defaults.Register(KafkaConfig.withDefaults) }

func (c KafkaConfig) withDefaults() KafkaConfig {
	c = config.Defaults(c)
	if c.HeartbeatInterval == 0 {
		c.HeartbeatInterval = c.SessionTimeout / 3 // derived, so it has no default tag
	}
	return c
}

// Validate reports the first field that cannot be used as a
// *framework.ConfigError named by its YAML key ("brokers"). Zero fields are valid.
func (c KafkaConfig) Validate() error {
	c = c.withDefaults()
	for i, b := range c.Brokers {
		host, port, err := net.SplitHostPort(strings.TrimSpace(b))
		if err != nil || host == "" || port == "" {
			return fieldErr("brokers", "entry %d (%q) is not host:port", i, b)
		}
	}
	var versionErr *framework.ConfigError
	if !kafkaVersionPattern.MatchString(c.Version) {
		// Sarama's own check (sarama.ParseKafkaVersion), without linking it.
		versionErr = &framework.ConfigError{Field: "version", Reason: "not a Kafka version (X.Y.Z)", Err: fmt.Errorf("invalid version `%s`", c.Version)}
	}
	t, s := c.TLS, c.SASL
	return firstError(
		when(strings.TrimSpace(c.ConsumerGroup) != c.ConsumerGroup, "consumer_group", "must not start or end with spaces, got %q", c.ConsumerGroup),
		when(c.InitialOffset != "oldest" && c.InitialOffset != "newest", "initial_offset", "must be %q or %q, got %q", "oldest", "newest", c.InitialOffset),
		versionErr,
		when(c.MaxWaitTime < time.Millisecond, "max_wait_time", "must be at least 1ms, got %s", c.MaxWaitTime),
		when(c.SessionTimeout < time.Millisecond, "session_timeout", "must be at least 1ms, got %s", c.SessionTimeout),
		when(c.HeartbeatInterval <= 0 || c.HeartbeatInterval >= c.SessionTimeout, "heartbeat_interval", "must be positive and below session_timeout (%s), got %s", c.SessionTimeout, c.HeartbeatInterval),
		when(c.RebalanceTimeout < time.Millisecond, "rebalance_timeout", "must be at least 1ms, got %s", c.RebalanceTimeout),
		// A dead member leaves only when its session times out: a shorter
		// rebalance would end without live members, which rejoin and start
		// the next one, again and again.
		when(c.RebalanceTimeout < c.SessionTimeout, "rebalance_timeout", "must not be below session_timeout (%s), got %s", c.SessionTimeout, c.RebalanceTimeout),
		when(c.CommitInterval < time.Millisecond, "commit_interval", "must be at least 1ms, got %s", c.CommitInterval),
		when(c.ReconnectBackoff < 0, "reconnect_backoff", "must not be negative, got %s", c.ReconnectBackoff),
		when(c.Window < 0, "window", "must not be negative (0 disables the window mode), got %d", c.Window),
		when(!t.Enabled && (t.CAFile != "" || t.CertFile != "" || t.KeyFile != ""), "tls.enabled", "must be true when TLS files are set"),
		// Name the one that is missing: that is the one the user has to set.
		when(t.Enabled && t.CertFile == "" && t.KeyFile != "", "tls.cert_file", "cert_file and key_file must be set together"),
		when(t.Enabled && t.CertFile != "" && t.KeyFile == "", "tls.key_file", "cert_file and key_file must be set together"),
		when(s.Mechanism == "" && (s.User != "" || s.Password != ""), "sasl.mechanism", "must be set when sasl.user or sasl.password is"),
		when(s.Mechanism != "" && s.Mechanism != "PLAIN" && s.Mechanism != "SCRAM-SHA-256" && s.Mechanism != "SCRAM-SHA-512", "sasl.mechanism", "must be PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512, got %q", s.Mechanism),
		when(s.Mechanism != "" && s.User == "", "sasl.user", "must not be empty with mechanism %s", s.Mechanism),
	)
}

// String prints the config with the SASL password redacted.
func (c KafkaConfig) String() string { return config.Format(c) }

// GoString makes %#v redact too.
func (c KafkaConfig) GoString() string { return "brokers.KafkaConfig" + c.String() }
