package kafka

import (
	"errors"
	"fmt"
	"time"

	"github.com/IBM/sarama"

	"github.com/claimtx/claimtx/brokers"
	"github.com/claimtx/claimtx/framework"
)

// saslProbeTimeout bounds each connection authError opens.
const saslProbeTimeout = 5 * time.Second

// authError returns err as a *framework.AuthError when it is the broker
// refusing the SASL credentials, nil otherwise. A real Kafka answers
// SASL_AUTHENTICATION_FAILED; some brokers (kfake among them) just close
// the connection, which Sarama reports as EOF, like a network fault. So,
// when SASL is configured and an attempt failed otherwise, each broker is
// asked for its API versions twice, once without and once with SASL: a
// broker that answers the first and not the second is reachable and
// refuses the credentials.
func authError(cfg brokers.KafkaConfig, err error) error {
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
	sc, serr := saramaConfig(cfg)
	if serr != nil {
		return nil
	}
	for _, addr := range cfg.Brokers {
		if probeBroker(addr, sc, false, saslProbeTimeout) != nil {
			continue
		}
		if perr := probeBroker(addr, sc, true, saslProbeTimeout); perr != nil {
			return wrap(fmt.Errorf("broker %s answers without SASL, and closes the connection with it: %w", addr, perr))
		}
	}
	return nil
}

// probeBroker opens one connection to addr, with or without sc's SASL
// settings, each step bounded by timeout, and asks for the broker's API
// versions. Readiness (IsConnected) and the authentication check share it.
func probeBroker(addr string, sc *sarama.Config, withSASL bool, timeout time.Duration) error {
	c := *sc // shallow copy: only the settings below differ
	c.Net.SASL.Enable = withSASL
	c.Net.DialTimeout, c.Net.ReadTimeout, c.Net.WriteTimeout = timeout, timeout, timeout
	c.ApiVersionsRequest = false // sent below, explicitly
	b := sarama.NewBroker(addr)
	if err := b.Open(&c); err != nil {
		return err
	}
	defer func() { _ = b.Close() }()
	_, err := b.ApiVersions(&sarama.ApiVersionsRequest{})
	return err
}
