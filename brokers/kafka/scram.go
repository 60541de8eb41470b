package kafka

import (
	"context"
	"errors"

	"github.com/IBM/sarama"
	"github.com/twmb/franz-go/pkg/sasl"
	"github.com/twmb/franz-go/pkg/sasl/scram"
)

// scramClient adapts franz-go's SCRAM client to Sarama, which ships only the
// server side of the exchange (its examples pull in xdg-go/scram).
type scramClient struct {
	sha512  bool
	session sasl.Session
	first   []byte
	done    bool
}

var _ sarama.SCRAMClient = (*scramClient)(nil)

func (s *scramClient) Begin(user, password, authzID string) error {
	auth := scram.Auth{Zid: authzID, User: user, Pass: password}
	mech := auth.AsSha256Mechanism()
	if s.sha512 {
		mech = auth.AsSha512Mechanism()
	}
	session, first, err := mech.Authenticate(context.Background(), "")
	if err != nil {
		return err
	}
	s.session, s.first = session, first
	return nil
}

// Step returns the client-first message for the empty challenge Sarama
// starts with, then answers each server message.
func (s *scramClient) Step(challenge string) (string, error) {
	if s.session == nil {
		return "", errors.New("brokers/kafka: SCRAM step before begin")
	}
	if s.first != nil {
		first := s.first
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
