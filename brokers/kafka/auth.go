package kafka

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/IBM/sarama"
	"github.com/twmb/franz-go/pkg/sasl"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/claimtx/claimtx/brokers"
	"github.com/claimtx/claimtx/framework"
)

// saslProbeTimeout bounds each connection authError opens.
const saslProbeTimeout = 5 * time.Second

// authError returns err as a *framework.AuthError when the broker refused
// the SASL credentials, nil otherwise. Some brokers (kfake) just close the
// connection instead of answering SASL_AUTHENTICATION_FAILED, which looks
// like a network fault, so each broker is asked for its API versions
// without and with SASL: answering only the first means refused
// credentials.
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

// probeBroker asks addr for its API versions on a connection of its own,
// with or without sc's SASL, each step bounded by timeout.
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

// scramClient adapts franz-go's SCRAM client to Sarama, which ships only the
// server side of the exchange (its examples pull in xdg-go/scram).
type scramClient struct {
	sha512  bool
	session sasl.Session
	first   []byte
	done    bool
}

func (s *scramClient) Begin(user, password, authzID string) error {
	auth := scram.Auth{Zid: authzID, User: user, Pass: password}
	mech := auth.AsSha256Mechanism()
	if s.sha512 {
		mech = auth.AsSha512Mechanism()
	}
	var err error
	s.session, s.first, err = mech.Authenticate(context.Background(), "")
	return err
}

// Step returns the client-first message for the empty challenge Sarama
// starts with, then answers each server message.
func (s *scramClient) Step(challenge string) (string, error) {
	if s.session == nil {
		return "", errors.New("brokers/kafka: SCRAM step before begin")
	}
	if first := s.first; first != nil {
		s.first = nil
		return string(first), nil
	}
	done, next, err := s.session.Challenge([]byte(challenge))
	if err != nil {
		return "", err
	}
	s.done = done
	return string(next), nil
}

func (s *scramClient) Done() bool { return s.done }
