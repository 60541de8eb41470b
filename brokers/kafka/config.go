package kafka

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"os"
	"strings"
	"time"

	"github.com/IBM/sarama"

	"github.com/claimtx/claimtx/brokers/internal/defaults"
	"github.com/claimtx/claimtx/brokers/internal/secret"
	"github.com/claimtx/claimtx/framework"
)

// Defaults. Each Config field's documentation repeats the value.
const (
	defaultBroker           = "127.0.0.1:9092"
	defaultInitialOffset    = OffsetOldest
	defaultVersion          = "3.6.0"
	defaultClientID         = "claimtx"
	defaultMaxWaitTime      = 100 * time.Millisecond
	defaultSessionTimeout   = 10 * time.Second
	defaultRebalanceTimeout = 60 * time.Second
	defaultCommitInterval   = time.Second
	defaultNackDelay        = time.Second
	defaultDialTimeout      = 30 * time.Second
	defaultReconnectBackoff = time.Second
)

// InitialOffset values.
const (
	OffsetOldest = "oldest"
	OffsetNewest = "newest"
)

// SASL mechanisms.
const (
	SASLPlain       = "PLAIN"
	SASLScramSHA256 = "SCRAM-SHA-256"
	SASLScramSHA512 = "SCRAM-SHA-512"
)

// Config configures the Kafka adapter. The zero value is usable: every zero
// field takes the default named in its documentation.
type Config struct {
	// Brokers are the bootstrap addresses (host:port).
	// Defaults to ["127.0.0.1:9092"].
	Brokers []string `yaml:"brokers"`

	// ConsumerGroup is the consumer group every Subscribe joins. Instances
	// with the same group share the partitions; each group gets every
	// message. Required by NewSubscriber (publishers ignore it); there is
	// no default, because a shared one would make two different services
	// on the same topic split its partitions, each missing the other's
	// half. framework/consumer defaults it to the consumer's Name.
	ConsumerGroup string `yaml:"consumer_group"`

	// InitialOffset is where a group starts on a partition it has no
	// committed offset for: "oldest" (everything retained) or "newest"
	// (only messages produced after the group joined). "oldest" is the only
	// choice that loses nothing for a new consumer; claims make the replay
	// of old messages harmless. Defaults to "oldest".
	InitialOffset string `yaml:"initial_offset"`

	// Version is the Kafka protocol version the publisher (Sarama) speaks,
	// as "X.Y.Z". 3.6.0 is verified against kfake and real brokers from 3.6
	// on; older clusters need their own version here. The subscriber
	// negotiates versions with the brokers. Defaults to "3.6.0".
	Version string `yaml:"version"`

	// ClientID is sent with every request (broker logs, quotas).
	// Defaults to "claimtx".
	ClientID string `yaml:"client_id"`

	// MaxWaitTime is how long a fetch waits on the broker for data. It is
	// also how long the end of a subscription can wait behind an open
	// fetch, so it is kept short (franz-go's own default is 5s).
	// Defaults to 100ms.
	MaxWaitTime time.Duration `yaml:"max_wait_time"`

	// SessionTimeout is how long the group coordinator waits without a
	// heartbeat before it evicts a member and gives its partitions to the
	// others. Shorter means faster failover after a crash, longer tolerates
	// longer pauses (GC, overloaded hosts). Brokers enforce
	// group.min/max.session.timeout.ms (kfake: GroupMinSessionTimeout).
	// Defaults to 10s.
	SessionTimeout time.Duration `yaml:"session_timeout"`

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
	RebalanceTimeout time.Duration `yaml:"rebalance_timeout"`

	// CommitInterval is how often marked (acked) offsets are committed.
	// After a crash, up to this much acked work is delivered again; the
	// claim turns those redeliveries into duplicates. Defaults to 1s.
	CommitInterval time.Duration `yaml:"commit_interval"`

	// NackDelay is how long the subscriber waits before it re-sends a nacked
	// message. Kafka cannot requeue one message: a nack re-sends a fresh
	// copy from memory, and the nacked message keeps its window slot (with
	// the default window of one, its partition waits for it). The router's
	// Retry and Poison middleware bound that; this only keeps the loop from
	// spinning. A negative value disables the delay. Defaults to 1s.
	NackDelay time.Duration `yaml:"nack_delay"`

	// Window is how many messages per partition the subscriber hands out
	// without waiting for earlier ones to be acked (for a batch consumer,
	// consumer.NewBatch: at least the batch size). An ack marks the offset
	// only once every earlier message of that partition is acked (the
	// committed offset never passes an unacked message). Messages of one
	// partition are handed out in order but, with a window above one, may
	// be acked out of order. 0 (the default) means one: a partition's next
	// message waits for the ack of the one before.
	Window int `yaml:"window"`

	// DialTimeout bounds how long NewPublisher and the first Subscribe retry
	// while no broker is reachable, instead of failing start-up. A negative
	// value means a single attempt. Defaults to 30s.
	DialTimeout time.Duration `yaml:"dial_timeout"`

	// ReconnectBackoff is the wait between those start-up attempts, and
	// between polls while every fetch fails. Defaults to 1s.
	ReconnectBackoff time.Duration `yaml:"reconnect_backoff"`

	// TLS enables TLS to the brokers.
	TLS TLSConfig `yaml:"tls"`

	// SASL enables SASL authentication. Its password is redacted whenever
	// the config is printed.
	SASL SASLConfig `yaml:"sasl"`
}

// TLSConfig is the TLS both clients use.
type TLSConfig struct {
	// Enabled turns TLS on. The system roots verify the brokers unless
	// CAFile is set. Defaults to false.
	Enabled bool `yaml:"enabled"`
	// CAFile is a PEM file of CA certificates to trust. Defaults to "".
	CAFile string `yaml:"ca_file"`
	// CertFile and KeyFile are the client certificate and key (PEM) for
	// mutual TLS. Both or neither. Default to "".
	CertFile string `yaml:"cert_file"`
	KeyFile  string `yaml:"key_file"`
	// ServerName overrides the name verified in the brokers' certificates.
	// Defaults to the host of each broker address.
	ServerName string `yaml:"server_name"`
	// InsecureSkipVerify disables certificate verification: anyone on the
	// path can read and change the traffic. Only for local experiments.
	// Defaults to false.
	InsecureSkipVerify bool `yaml:"insecure_skip_verify"`
}

// SASLConfig is the SASL both clients use.
type SASLConfig struct {
	// Mechanism is "PLAIN", "SCRAM-SHA-256" or "SCRAM-SHA-512"; empty
	// disables SASL. PLAIN sends the password as is: use it with TLS.
	// Defaults to "".
	Mechanism string `yaml:"mechanism"`
	// User is the SASL user name. Defaults to "".
	User string `yaml:"user"`
	// Password is the SASL password. Defaults to "".
	Password string `yaml:"password"`
}

// String prints the SASL settings with the password redacted.
func (s SASLConfig) String() string {
	return fmt.Sprintf("{Mechanism:%q User:%q Password:%q}", s.Mechanism, s.User, secret.Redact(s.Password))
}

// GoString makes %#v redact too.
func (s SASLConfig) GoString() string { return "kafka.SASLConfig" + s.String() }

// Package brokers writes the defaults out in the Config it builds.
func init() { defaults.Register(Config.withDefaults) }

// withDefaults returns a copy of c with every zero field set to its
// default, as documented on each field.
func (c Config) withDefaults() Config {
	if len(c.Brokers) == 0 {
		c.Brokers = []string{defaultBroker}
	}
	if c.InitialOffset == "" {
		c.InitialOffset = defaultInitialOffset
	}
	if c.Version == "" {
		c.Version = defaultVersion
	}
	if c.ClientID == "" {
		c.ClientID = defaultClientID
	}
	if c.MaxWaitTime == 0 {
		c.MaxWaitTime = defaultMaxWaitTime
	}
	if c.SessionTimeout == 0 {
		c.SessionTimeout = defaultSessionTimeout
	}
	if c.HeartbeatInterval == 0 {
		c.HeartbeatInterval = c.SessionTimeout / 3
	}
	if c.RebalanceTimeout == 0 {
		c.RebalanceTimeout = defaultRebalanceTimeout
	}
	if c.CommitInterval == 0 {
		c.CommitInterval = defaultCommitInterval
	}
	if c.NackDelay == 0 {
		c.NackDelay = defaultNackDelay
	}
	if c.DialTimeout == 0 {
		c.DialTimeout = defaultDialTimeout
	}
	if c.ReconnectBackoff == 0 {
		c.ReconnectBackoff = defaultReconnectBackoff
	}
	return c
}

// Validate reports the first field that cannot be used, as a
// *framework.ConfigError.
// Zero fields are valid: they take their defaults. Field names are the YAML
// keys; brokers.Config.Validate prefixes them with "kafka.".
func (c Config) Validate() error {
	c = c.withDefaults()
	for i, b := range c.Brokers {
		host, port, err := net.SplitHostPort(strings.TrimSpace(b))
		if err != nil || host == "" || port == "" {
			return configErr("brokers", "entry %d (%q) is not host:port", i, b)
		}
	}
	if strings.TrimSpace(c.ConsumerGroup) != c.ConsumerGroup {
		return configErr("consumer_group", "must not start or end with spaces, got %q", c.ConsumerGroup)
	}
	if c.InitialOffset != OffsetOldest && c.InitialOffset != OffsetNewest {
		return configErr("initial_offset", "must be %q or %q, got %q", OffsetOldest, OffsetNewest, c.InitialOffset)
	}
	if _, err := sarama.ParseKafkaVersion(c.Version); err != nil {
		return &framework.ConfigError{Field: "version", Reason: "not a Kafka version (X.Y.Z)", Err: err}
	}
	switch {
	case c.MaxWaitTime < time.Millisecond:
		return configErr("max_wait_time", "must be at least 1ms, got %s", c.MaxWaitTime)
	case c.SessionTimeout < time.Millisecond:
		return configErr("session_timeout", "must be at least 1ms, got %s", c.SessionTimeout)
	case c.HeartbeatInterval <= 0 || c.HeartbeatInterval >= c.SessionTimeout:
		return configErr("heartbeat_interval", "must be positive and below session_timeout (%s), got %s", c.SessionTimeout, c.HeartbeatInterval)
	case c.RebalanceTimeout < time.Millisecond:
		return configErr("rebalance_timeout", "must be at least 1ms, got %s", c.RebalanceTimeout)
	case c.RebalanceTimeout < c.SessionTimeout:
		// A live member learns of a rebalance from its next heartbeat, and
		// a dead one leaves the group only when its session times out: a
		// rebalance shorter than the session would end without members
		// that are alive, which rejoin and start the next one, again and
		// again.
		return configErr("rebalance_timeout", "must not be below session_timeout (%s), got %s", c.SessionTimeout, c.RebalanceTimeout)
	case c.CommitInterval < time.Millisecond:
		return configErr("commit_interval", "must be at least 1ms, got %s", c.CommitInterval)
	case c.ReconnectBackoff < 0:
		return configErr("reconnect_backoff", "must not be negative, got %s", c.ReconnectBackoff)
	case c.Window < 0:
		return configErr("window", "must not be negative (0 disables the window mode), got %d", c.Window)
	}
	if err := c.TLS.validate(); err != nil {
		return err
	}
	switch c.SASL.Mechanism {
	case "":
		if c.SASL.User != "" || c.SASL.Password != "" {
			return configErr("sasl.mechanism", "must be set when sasl.user or sasl.password is")
		}
	case SASLPlain, SASLScramSHA256, SASLScramSHA512:
		if c.SASL.User == "" {
			return configErr("sasl.user", "must not be empty with mechanism %s", c.SASL.Mechanism)
		}
	default:
		return configErr("sasl.mechanism", "must be %s, %s or %s, got %q", SASLPlain, SASLScramSHA256, SASLScramSHA512, c.SASL.Mechanism)
	}
	return nil
}

// configErr is a *framework.ConfigError for field (its YAML key) with a
// formatted reason.
func configErr(field, format string, args ...any) *framework.ConfigError {
	return &framework.ConfigError{Field: field, Reason: fmt.Sprintf(format, args...)}
}

// validateSubscriber checks what only a subscriber needs, so a publisher
// can still be built from a Config without a group.
func (c Config) validateSubscriber() error {
	if c.ConsumerGroup == "" {
		return configErr("consumer_group", "must not be empty for a subscriber: set KAFKA_CONSUMER_GROUP or kafka.consumer_group to a group of this service's own (framework/consumer defaults it to the consumer's Name)")
	}
	return nil
}

func (t TLSConfig) validate() error {
	if !t.Enabled {
		if t.CAFile != "" || t.CertFile != "" || t.KeyFile != "" {
			return configErr("tls.enabled", "must be true when TLS files are set")
		}
		return nil
	}
	// Name the one that is missing: that is the one the user has to set.
	if t.CertFile == "" && t.KeyFile != "" {
		return configErr("tls.cert_file", "cert_file and key_file must be set together")
	}
	if t.CertFile != "" && t.KeyFile == "" {
		return configErr("tls.key_file", "cert_file and key_file must be set together")
	}
	return nil
}

// String prints the config with the SASL password redacted.
func (c Config) String() string {
	return fmt.Sprintf("{Brokers:%v ConsumerGroup:%q InitialOffset:%q Version:%q ClientID:%q MaxWaitTime:%s SessionTimeout:%s HeartbeatInterval:%s RebalanceTimeout:%s CommitInterval:%s NackDelay:%s Window:%d DialTimeout:%s ReconnectBackoff:%s TLS:%+v SASL:%s}",
		c.Brokers, c.ConsumerGroup, c.InitialOffset, c.Version, c.ClientID, c.MaxWaitTime, c.SessionTimeout,
		c.HeartbeatInterval, c.RebalanceTimeout, c.CommitInterval, c.NackDelay, c.Window, c.DialTimeout, c.ReconnectBackoff,
		c.TLS, c.SASL)
}

// GoString makes %#v redact too.
func (c Config) GoString() string { return "kafka.Config" + c.String() }

// saramaConfig validates c and returns the Sarama configuration it maps to
// (defaults applied). The package documentation lists the mapping.
func (c Config) saramaConfig() (*sarama.Config, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	c = c.withDefaults()
	version, _ := sarama.ParseKafkaVersion(c.Version)

	sc := sarama.NewConfig()
	sc.ClientID = c.ClientID
	sc.Version = version

	sc.Consumer.Return.Errors = true
	sc.Consumer.MaxWaitTime = c.MaxWaitTime
	sc.Consumer.Offsets.Initial = sarama.OffsetOldest
	if c.InitialOffset == OffsetNewest {
		sc.Consumer.Offsets.Initial = sarama.OffsetNewest
	}
	sc.Consumer.Offsets.AutoCommit.Enable = true
	sc.Consumer.Offsets.AutoCommit.Interval = c.CommitInterval
	sc.Consumer.Group.Session.Timeout = c.SessionTimeout
	sc.Consumer.Group.Heartbeat.Interval = c.HeartbeatInterval
	sc.Consumer.Group.Rebalance.Timeout = c.RebalanceTimeout

	// A sync producer that waits for all in-sync replicas; idempotence
	// keeps Sarama's own retries from writing a message twice.
	sc.Producer.Return.Successes = true
	sc.Producer.Return.Errors = true
	sc.Producer.RequiredAcks = sarama.WaitForAll
	sc.Producer.Retry.Max = 10
	if version.IsAtLeast(sarama.V0_11_0_0) {
		sc.Producer.Idempotent = true
		sc.Net.MaxOpenRequests = 1
	}

	if c.TLS.Enabled {
		tc, err := c.TLS.tlsConfig()
		if err != nil {
			return nil, err
		}
		sc.Net.TLS.Enable = true
		sc.Net.TLS.Config = tc
	}
	if c.SASL.Mechanism != "" {
		sc.Net.SASL.Enable = true
		sc.Net.SASL.Handshake = true
		sc.Net.SASL.User = c.SASL.User
		sc.Net.SASL.Password = c.SASL.Password
		switch c.SASL.Mechanism {
		case SASLPlain:
			sc.Net.SASL.Mechanism = sarama.SASLTypePlaintext
		case SASLScramSHA256:
			sc.Net.SASL.Mechanism = sarama.SASLTypeSCRAMSHA256
			sc.Net.SASL.SCRAMClientGeneratorFunc = func() sarama.SCRAMClient { return &scramClient{sha512: false} }
		case SASLScramSHA512:
			sc.Net.SASL.Mechanism = sarama.SASLTypeSCRAMSHA512
			sc.Net.SASL.SCRAMClientGeneratorFunc = func() sarama.SCRAMClient { return &scramClient{sha512: true} }
		}
	}
	if err := sc.Validate(); err != nil {
		return nil, &framework.ConfigError{Field: "kafka", Reason: "rejected by Sarama", Err: err}
	}
	return sc, nil
}

func (t TLSConfig) tlsConfig() (*tls.Config, error) {
	tc := &tls.Config{
		MinVersion:         tls.VersionTLS12,
		ServerName:         t.ServerName,
		InsecureSkipVerify: t.InsecureSkipVerify, //nolint:gosec // opt-in, documented as unsafe
	}
	if t.CAFile != "" {
		pem, err := os.ReadFile(t.CAFile)
		if err != nil {
			return nil, &framework.ConfigError{Field: "tls.ca_file", Reason: "cannot be read", Err: err}
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, configErr("tls.ca_file", "no PEM certificate found in %s", t.CAFile)
		}
		tc.RootCAs = pool
	}
	if t.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
		if err != nil {
			return nil, &framework.ConfigError{Field: "tls.cert_file", Reason: "cannot load the client certificate and key", Err: err}
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	return tc, nil
}
