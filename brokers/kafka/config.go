package kafka

import (
	"crypto/tls"
	"crypto/x509"
	"os"

	"github.com/IBM/sarama"

	"github.com/claimtx/claimtx/brokers"
	"github.com/claimtx/claimtx/brokers/internal/defaults"
	"github.com/claimtx/claimtx/framework"
)

// brokers.KafkaConfig.InitialOffset and SASL.Mechanism values.
const (
	offsetNewest = "newest"

	saslPlain       = "PLAIN"
	saslScramSHA256 = "SCRAM-SHA-256"
	saslScramSHA512 = "SCRAM-SHA-512"
)

// saramaConfig validates c and returns its Sarama configuration, for the
// publisher and the probes (defaults applied).
func saramaConfig(c brokers.KafkaConfig) (*sarama.Config, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	c = defaults.Apply(c)
	version, _ := sarama.ParseKafkaVersion(c.Version)

	sc := sarama.NewConfig()
	sc.ClientID = c.ClientID
	sc.Version = version

	// Only for Sarama's validation (the consumer is franz-go's): it
	// refuses a few absurd values Validate lets through.
	sc.Consumer.Group.Session.Timeout = c.SessionTimeout
	sc.Consumer.Group.Heartbeat.Interval = c.HeartbeatInterval
	sc.Consumer.Group.Rebalance.Timeout = c.RebalanceTimeout

	// Idempotence keeps Sarama's retries from writing a message twice.
	sc.Producer.Return.Successes = true
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
		sc.Net.SASL.User = c.SASL.User
		sc.Net.SASL.Password = c.SASL.Password
		sc.Net.SASL.Mechanism = sarama.SASLMechanism(c.SASL.Mechanism) // the same names
		if c.SASL.Mechanism != saslPlain {
			sha512 := c.SASL.Mechanism == saslScramSHA512
			sc.Net.SASL.SCRAMClientGeneratorFunc = func() sarama.SCRAMClient { return &scramClient{sha512: sha512} }
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
			return nil, &framework.ConfigError{Field: "tls.ca_file", Reason: "no PEM certificate found in " + t.CAFile}
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
