package nats

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/claimtx/claimtx/brokers"
	"github.com/claimtx/claimtx/brokers/internal/defaults"
	"github.com/claimtx/claimtx/framework"
)

const streamsRequire = "require"

// settings is brokers.Config.NATS with its defaults applied.
type settings brokers.NATSConfig

// parseSettings returns cfg.NATS with its defaults, after the one check
// brokers.Config.Validate leaves to the adapter: the subject prefix.
func parseSettings(cfg brokers.Config) (settings, error) {
	s := settings(defaults.Apply(cfg.NATS))
	if s.SubjectPrefix != "" {
		if err := checkSubject(s.SubjectPrefix, true); err != nil {
			return s, &framework.ConfigError{Field: "nats.subject_prefix", Reason: err.Error()}
		}
	}
	return s, nil
}

var errBadSubject = errors.New("not a NATS subject")

// checkSubject checks a subject (or, with prefix, the start of one):
// printable, no whitespace, no wildcard, no empty token.
func checkSubject(s string, prefix bool) error {
	if s == "" {
		return fmt.Errorf("%w: empty", errBadSubject)
	}
	if strings.ContainsFunc(s, func(r rune) bool { return r <= ' ' || r == 0x7f || r == '*' || r == '>' }) {
		return fmt.Errorf("%w: %q holds whitespace, a control character or a wildcard (* >)", errBadSubject, s)
	}
	body := s
	if prefix {
		body = strings.TrimSuffix(s, ".") // "prod." is a prefix: the topic ends the token
	}
	if slices.Contains(strings.Split(body, "."), "") {
		return fmt.Errorf("%w: %q has an empty token (a leading, trailing or double '.')", errBadSubject, s)
	}
	return nil
}

func (s settings) subject(topic string) (string, error) {
	subj := s.SubjectPrefix + topic
	if err := checkSubject(subj, false); err != nil {
		return "", fmt.Errorf("brokers/nats: topic %q: %w", topic, err)
	}
	return subj, nil
}
