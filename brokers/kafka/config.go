package kafka

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"

	"github.com/IBM/sarama"

	"github.com/claimtx/claimtx/brokers"
	"github.com/claimtx/claimtx/brokers/internal/defaults"
	"github.com/claimtx/claimtx/framework"
)

// The adapter is configured with brokers.KafkaConfig, which package brokers
// holds so that a brokers.Config can carry it without linking this
// adapter's client: it is the one name of the adapter's settings.

// brokers.KafkaConfig.InitialOffset values.
const (
	offsetOldest = "oldest"
	offsetNewest = "newest"
)

// brokers.KafkaConfig.SASL.Mechanism values.
const (
	saslPlain       = "PLAIN"
	saslScramSHA256 = "SCRAM-SHA-256"
	saslScramSHA512 = "SCRAM-SHA-512"
)

// withDefaults is c with every zero field at its documented default.
func withDefaults(c brokers.KafkaConfig) brokers.KafkaConfig { return defaults.Apply(c) }

// configErr is a *framework.ConfigError for field (its YAML key) with a
// formatted reason.
func configErr(field, format string, args ...any) *framework.ConfigError {
	return &framework.ConfigError{Field: field, Reason: fmt.Sprintf(format, args...)}
}

// validateSubscriber checks what only a subscriber needs, so a publisher
// can still be built from a brokers.KafkaConfig without a group.
func validateSubscriber(c brokers.KafkaConfig) error {
	if c.ConsumerGroup == "" {
		return configErr("consumer_group", "must not be empty for a subscriber: set KAFKA_CONSUMER_GROUP or kafka.consumer_group to a group of this service's own (framework/consumer defaults it to the consumer's Name)")
	}
	return nil
}

// saramaConfig validates c and returns the Sarama configuration it maps to
// (defaults applied). The package documentation lists the mapping.
func saramaConfig(c brokers.KafkaConfig) (*sarama.Config, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	c = withDefaults(c)
	version, _ := sarama.ParseKafkaVersion(c.Version)

	sc := sarama.NewConfig()
	sc.ClientID = c.ClientID
	sc.Version = version

	sc.Consumer.Return.Errors = true
	sc.Consumer.MaxWaitTime = c.MaxWaitTime
	sc.Consumer.Offsets.Initial = sarama.OffsetOldest
	if c.InitialOffset == offsetNewest {
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
		tc, err := tlsConfig(c.TLS)
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
		case saslPlain:
			sc.Net.SASL.Mechanism = sarama.SASLTypePlaintext
		case saslScramSHA256:
			sc.Net.SASL.Mechanism = sarama.SASLTypeSCRAMSHA256
			sc.Net.SASL.SCRAMClientGeneratorFunc = func() sarama.SCRAMClient { return &scramClient{sha512: false} }
		case saslScramSHA512:
			sc.Net.SASL.Mechanism = sarama.SASLTypeSCRAMSHA512
			sc.Net.SASL.SCRAMClientGeneratorFunc = func() sarama.SCRAMClient { return &scramClient{sha512: true} }
		}
	}
	if err := sc.Validate(); err != nil {
		return nil, &framework.ConfigError{Field: "kafka", Reason: "rejected by Sarama", Err: err}
	}
	return sc, nil
}

func tlsConfig(t brokers.KafkaTLSConfig) (*tls.Config, error) {
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
