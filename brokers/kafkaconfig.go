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

// brokers/kafka takes these types as they are (see AMQPConfig for why
// they live here).

// kafkaVersionPattern is what sarama.ParseKafkaVersion accepts: X.Y.Z, or
// 0.X.Y.Z before Kafka 1.0.
var kafkaVersionPattern = regexp.MustCompile(`^(0\.\d+\.\d+\.\d+|[1-9]\d*\.\d+\.\d+)$`)

// InitialOffset values.
const (
	kafkaOffsetOldest = "oldest"
	kafkaOffsetNewest = "newest"
)

// SASL mechanisms.
const (
	kafkaSASLPlain       = "PLAIN"
	kafkaSASLScramSHA256 = "SCRAM-SHA-256"
	kafkaSASLScramSHA512 = "SCRAM-SHA-512"
)

// KafkaConfig configures the Kafka adapter. The zero value is usable: every zero
// field takes the default named in its documentation.
type KafkaConfig struct {
	// Brokers are the bootstrap addresses (host:port).
	// Defaults to ["127.0.0.1:9092"].
	Brokers []string `yaml:"brokers" env:"KAFKA_BROKERS" default:"127.0.0.1:9092"`

	// ConsumerGroup is the consumer group every Subscribe joins. Instances
	// with the same group share the partitions; each group gets every
	// message. Required by NewSubscriber (publishers ignore it); there is
	// no default, because a shared one would make two different services
	// on the same topic split its partitions, each missing the other's
	// half. framework/consumer defaults it to the consumer's Name.
	ConsumerGroup string `yaml:"consumer_group" env:"KAFKA_CONSUMER_GROUP"`

	// InitialOffset is where a group starts on a partition it has no
	// committed offset for: "oldest" (everything retained) or "newest"
	// (only messages produced after the group joined). "oldest" is the only
	// choice that loses nothing for a new consumer; claims make the replay
	// of old messages harmless. Defaults to "oldest".
	InitialOffset string `yaml:"initial_offset" env:"KAFKA_INITIAL_OFFSET" default:"oldest"`

	// Version is the Kafka protocol version the publisher (Sarama) speaks,
	// as "X.Y.Z". 3.6.0 is verified against kfake and real brokers from 3.6
	// on; older clusters need their own version here. The subscriber
	// negotiates versions with the brokers. Defaults to "3.6.0".
	Version string `yaml:"version" env:"KAFKA_VERSION" default:"3.6.0"`

	// ClientID is sent with every request (broker logs, quotas).
	// Defaults to "claimtx".
	ClientID string `yaml:"client_id" env:"KAFKA_CLIENT_ID" default:"claimtx"`

	// MaxWaitTime is how long a fetch waits on the broker for data. It is
	// also how long the end of a subscription can wait behind an open
	// fetch, so it is kept short (franz-go's own default is 5s).
	// Defaults to 100ms.
	MaxWaitTime time.Duration `yaml:"max_wait_time" default:"100ms"`

	// SessionTimeout is how long the group coordinator waits without a
	// heartbeat before it evicts a member and gives its partitions to the
	// others. Shorter means faster failover after a crash, longer tolerates
	// longer pauses (GC, overloaded hosts). Brokers enforce
	// group.min/max.session.timeout.ms (kfake: GroupMinSessionTimeout).
	// Defaults to 10s.
	SessionTimeout time.Duration `yaml:"session_timeout" env:"KAFKA_SESSION_TIMEOUT" default:"10s"`

	// HeartbeatInterval is how often a member heartbeats; it must be below
	// SessionTimeout. Defaults to SessionTimeout/3.
	HeartbeatInterval time.Duration `yaml:"heartbeat_interval"`

	// RebalanceTimeout is how long the coordinator waits for every member to
	// rejoin during a rebalance; a member that does not make it is dropped.
	// Group requests wait for their answer this long plus 10s, since the
	// coordinator may hold a JoinGroup answer until the rebalance ends.
	// A rebalance does not wait for messages in flight (see the package
	// documentation), so a long value costs nothing unless a member dies
	// mid-rebalance. Must not be below SessionTimeout. Defaults to 60s.
	RebalanceTimeout time.Duration `yaml:"rebalance_timeout" env:"KAFKA_REBALANCE_TIMEOUT" default:"60s"`

	// CommitInterval is how often marked (acked) offsets are committed.
	// After a crash, up to this much acked work is delivered again; the
	// claim turns those redeliveries into duplicates. Defaults to 1s.
	CommitInterval time.Duration `yaml:"commit_interval" default:"1s"`

	// NackDelay is how long the subscriber waits before it re-sends a nacked
	// message. Kafka cannot requeue one message: a nack re-sends a fresh
	// copy from memory, and the nacked message keeps its window slot (with
	// the default window of one, its partition waits for it). The router's
	// Retry and Poison middleware bound that; this only keeps the loop from
	// spinning. A negative value disables the delay. Defaults to 1s.
	NackDelay time.Duration `yaml:"nack_delay" env:"KAFKA_NACK_DELAY" default:"1s"`

	// Window is how many messages per partition the subscriber hands out
	// without waiting for earlier ones to be acked (for a batch consumer,
	// consumer.NewBatch: at least the batch size). An ack marks the offset
	// only once every earlier message of that partition is acked (the
	// committed offset never passes an unacked message). Messages of one
	// partition are handed out in order but, with a window above one, may
	// be acked out of order. 0 (the default) means one: a partition's next
	// message waits for the ack of the one before.
	Window int `yaml:"window" env:"KAFKA_WINDOW,positive"`

	// DialTimeout bounds how long NewPublisher and the first Subscribe retry
	// while no broker is reachable, instead of failing start-up. A negative
	// value means a single attempt. Defaults to 30s.
	DialTimeout time.Duration `yaml:"dial_timeout" env:"KAFKA_DIAL_TIMEOUT" default:"30s"`

	// ReconnectBackoff is the wait between those start-up attempts, and
	// between polls while every fetch fails. Defaults to 1s.
	ReconnectBackoff time.Duration `yaml:"reconnect_backoff" default:"1s"`

	// TLS enables TLS to the brokers.
	TLS KafkaTLSConfig `yaml:"tls"`

	// SASL enables SASL authentication. Its password is redacted whenever
	// the config is printed.
	SASL KafkaSASLConfig `yaml:"sasl"`
}

// KafkaTLSConfig is the TLS both clients use.
type KafkaTLSConfig struct {
	// Enabled turns TLS on. The system roots verify the brokers unless
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
	// InsecureSkipVerify disables certificate verification: anyone on the
	// path can read and change the traffic. Only for local experiments.
	// Defaults to false.
	InsecureSkipVerify bool `yaml:"insecure_skip_verify"`
}

// KafkaSASLConfig is the SASL both clients use.
type KafkaSASLConfig struct {
	// Mechanism is "PLAIN", "SCRAM-SHA-256" or "SCRAM-SHA-512"; empty
	// disables SASL. PLAIN sends the password as is: use it with TLS.
	// Defaults to "".
	Mechanism string `yaml:"mechanism" env:"KAFKA_SASL_MECHANISM"`
	// User is the SASL user name. Defaults to "".
	User string `yaml:"user" env:"KAFKA_SASL_USER"`
	// Password is the SASL password. Defaults to "".
	Password string `yaml:"password" env:"KAFKA_SASL_PASSWORD,secret"`
}

// String prints the SASL settings with the password redacted.
func (s KafkaSASLConfig) String() string { return config.Format(s) }

// GoString makes %#v redact too.
func (s KafkaSASLConfig) GoString() string { return "brokers.KafkaSASLConfig" + s.String() }

// The adapter applies the same defaults (defaults.Apply) without an
// exported method for it.
func init() { defaults.Register(KafkaConfig.withDefaults) }

// withDefaults returns a copy of c with every zero field set to its
// default, as documented on each field.
func (c KafkaConfig) withDefaults() KafkaConfig {
	c = config.Defaults(c)
	if c.HeartbeatInterval == 0 {
		c.HeartbeatInterval = c.SessionTimeout / 3 // derived, so it has no default tag
	}
	return c
}

// Validate reports the first field that cannot be used, as a
// *framework.ConfigError.
// Zero fields are valid: they take their defaults. Field names are the YAML
// keys; brokers.Config.Validate prefixes them with "kafka.".
func (c KafkaConfig) Validate() error {
	c = c.withDefaults()
	for i, b := range c.Brokers {
		host, port, err := net.SplitHostPort(strings.TrimSpace(b))
		if err != nil || host == "" || port == "" {
			return fieldErr("brokers", "entry %d (%q) is not host:port", i, b)
		}
	}
	if strings.TrimSpace(c.ConsumerGroup) != c.ConsumerGroup {
		return fieldErr("consumer_group", "must not start or end with spaces, got %q", c.ConsumerGroup)
	}
	if c.InitialOffset != kafkaOffsetOldest && c.InitialOffset != kafkaOffsetNewest {
		return fieldErr("initial_offset", "must be %q or %q, got %q", kafkaOffsetOldest, kafkaOffsetNewest, c.InitialOffset)
	}
	if !kafkaVersionPattern.MatchString(c.Version) {
		// Sarama's own check (sarama.ParseKafkaVersion), without linking it.
		return &framework.ConfigError{Field: "version", Reason: "not a Kafka version (X.Y.Z)", Err: fmt.Errorf("invalid version `%s`", c.Version)}
	}
	switch {
	case c.MaxWaitTime < time.Millisecond:
		return fieldErr("max_wait_time", "must be at least 1ms, got %s", c.MaxWaitTime)
	case c.SessionTimeout < time.Millisecond:
		return fieldErr("session_timeout", "must be at least 1ms, got %s", c.SessionTimeout)
	case c.HeartbeatInterval <= 0 || c.HeartbeatInterval >= c.SessionTimeout:
		return fieldErr("heartbeat_interval", "must be positive and below session_timeout (%s), got %s", c.SessionTimeout, c.HeartbeatInterval)
	case c.RebalanceTimeout < time.Millisecond:
		return fieldErr("rebalance_timeout", "must be at least 1ms, got %s", c.RebalanceTimeout)
	case c.RebalanceTimeout < c.SessionTimeout:
		// A live member learns of a rebalance from its next heartbeat, and
		// a dead one leaves the group only when its session times out: a
		// rebalance shorter than the session would end without members
		// that are alive, which rejoin and start the next one, again and
		// again.
		return fieldErr("rebalance_timeout", "must not be below session_timeout (%s), got %s", c.SessionTimeout, c.RebalanceTimeout)
	case c.CommitInterval < time.Millisecond:
		return fieldErr("commit_interval", "must be at least 1ms, got %s", c.CommitInterval)
	case c.ReconnectBackoff < 0:
		return fieldErr("reconnect_backoff", "must not be negative, got %s", c.ReconnectBackoff)
	case c.Window < 0:
		return fieldErr("window", "must not be negative (0 disables the window mode), got %d", c.Window)
	}
	if err := c.TLS.validate(); err != nil {
		return err
	}
	switch c.SASL.Mechanism {
	case "":
		if c.SASL.User != "" || c.SASL.Password != "" {
			return fieldErr("sasl.mechanism", "must be set when sasl.user or sasl.password is")
		}
	case kafkaSASLPlain, kafkaSASLScramSHA256, kafkaSASLScramSHA512:
		if c.SASL.User == "" {
			return fieldErr("sasl.user", "must not be empty with mechanism %s", c.SASL.Mechanism)
		}
	default:
		return fieldErr("sasl.mechanism", "must be %s, %s or %s, got %q", kafkaSASLPlain, kafkaSASLScramSHA256, kafkaSASLScramSHA512, c.SASL.Mechanism)
	}
	return nil
}

func (t KafkaTLSConfig) validate() error {
	if !t.Enabled {
		if t.CAFile != "" || t.CertFile != "" || t.KeyFile != "" {
			return fieldErr("tls.enabled", "must be true when TLS files are set")
		}
		return nil
	}
	// Name the one that is missing: that is the one the user has to set.
	if t.CertFile == "" && t.KeyFile != "" {
		return fieldErr("tls.cert_file", "cert_file and key_file must be set together")
	}
	if t.CertFile != "" && t.KeyFile == "" {
		return fieldErr("tls.key_file", "cert_file and key_file must be set together")
	}
	return nil
}

// String prints the config with the SASL password redacted.
func (c KafkaConfig) String() string { return config.Format(c) }

// GoString makes %#v redact too.
func (c KafkaConfig) GoString() string { return "brokers.KafkaConfig" + c.String() }
