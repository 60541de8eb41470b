package kafka

import (
	"errors"
	"fmt"
	"time"

	"github.com/IBM/sarama"

	"github.com/claimtx/claimtx/framework"
)

// probeTimeout bounds each connection saslRejected opens.
const probeTimeout = 5 * time.Second

// authError returns err as a *framework.AuthError when it is the broker
// refusing the SASL credentials, nil otherwise. A real Kafka answers
// SASL_AUTHENTICATION_FAILED; some brokers (kfake among them) just close
// the connection, which Sarama reports as EOF, like a network fault. So,
// when SASL is configured and an attempt failed otherwise, each broker is
// asked for its API versions twice, once without and once with SASL: a
// broker that answers the first and not the second is reachable and
// refuses the credentials.
func authError(cfg Config, err error) error {
	wrap := func(cause error) error {
		return &framework.AuthError{Dependency: "Kafka",
			Err: fmt.Errorf("SASL %s authentication: %w", cfg.SASL.Mechanism, cause)}
	}
	if errors.Is(err, sarama.ErrSASLAuthenticationFailed) {
		return wrap(err)
	}
	if cfg.SASL.Mechanism == "" {
		return nil
	}
	sc, serr := cfg.SaramaConfig()
	if serr != nil {
		return nil
	}
	for _, addr := range cfg.Brokers {
		if probe(addr, sc, false) != nil {
			continue
		}
		if perr := probe(addr, sc, true); perr != nil {
			return wrap(fmt.Errorf("broker %s answers without SASL, and closes the connection with it: %w", addr, perr))
		}
	}
	return nil
}

// probe opens one connection to addr, with or without sc's SASL settings,
// and asks for the broker's API versions.
func probe(addr string, sc *sarama.Config, withSASL bool) error {
	c := *sc
	c.Net.SASL.Enable = withSASL
	c.Net.DialTimeout, c.Net.ReadTimeout, c.Net.WriteTimeout = probeTimeout, probeTimeout, probeTimeout
	b := sarama.NewBroker(addr)
	if err := b.Open(&c); err != nil {
		return err
	}
	defer func() { _ = b.Close() }()
	_, err := b.ApiVersions(&sarama.ApiVersionsRequest{})
	return err
}
