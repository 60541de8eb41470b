package nats

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/claimtx/claimtx/brokers"
	"github.com/claimtx/claimtx/framework"
)

// Option keys, as written under options: in YAML. brokers.LoadConfig("")
// sets each one from NATS_<KEY IN UPPER CASE> when BROKER=nats.
const (
	optURL           = "url"
	optUser          = "user"
	optPassword      = "password"
	optToken         = "token"
	optCredsFile     = "creds_file"
	optDurable       = "durable"
	optSubjectPrefix = "subject_prefix"
	optAckWait       = "ack_wait"
	optMaxDeliver    = "max_deliver"
	optMaxAckPending = "max_ack_pending"
	optNackDelay     = "nack_delay"
	optConcurrency   = "concurrency"
	optStreams       = "streams"
	optDialTimeout   = "dial_timeout"
)

// Defaults, as documented in doc.go.
const (
	defaultURL           = "nats://127.0.0.1:4222"
	defaultAckWait       = 30 * time.Second
	defaultMaxDeliver    = -1 // unlimited: see doc.go, "MaxDeliver"
	defaultMaxAckPending = 256
	defaultNackDelay     = time.Second
	defaultConcurrency   = 4
	defaultDialTimeout   = 30 * time.Second

	streamsCreate  = "create"
	streamsRequire = "require"

	// maxConcurrency bounds the workers (pull subscriptions) of one Subscribe.
	maxConcurrency = 4096
)

var knownOptions = map[string]bool{
	optURL: true, optUser: true, optPassword: true, optToken: true, optCredsFile: true,
	optDurable: true, optSubjectPrefix: true, optAckWait: true, optMaxDeliver: true,
	optMaxAckPending: true, optNackDelay: true, optConcurrency: true, optStreams: true,
	optDialTimeout: true,
}

// durablePattern is what JetStream accepts as a durable name (it is a
// token of the consumer's API subjects: no '.', '*', '>' or whitespace).
var durablePattern = regexp.MustCompile(`^[A-Za-z0-9_-]{1,200}$`)

// settings is brokers.Config.Options parsed, defaults applied.
type settings struct {
	url, user, password, token, credsFile string
	durable, subjectPrefix                string
	ackWait, nackDelay, dialTimeout       time.Duration
	maxDeliver, maxAckPending             int
	concurrency                           int
	streams                               string
}

// optErr is a *framework.ConfigError about option key. Its Field is the
// YAML path "options.<key>"; package brokers renames it to the variable
// (NATS_<KEY>) when the value came from the environment.
func optErr(key, format string, args ...any) error {
	return &framework.ConfigError{Field: "options." + key, Reason: fmt.Sprintf(format, args...)}
}

// parseSettings reads cfg.Options. Every problem is a
// *framework.ConfigError naming the option; values that may hold a
// secret (the URL, password, token) are never quoted.
func parseSettings(cfg brokers.Config) (settings, error) {
	s := settings{
		url:           defaultURL,
		ackWait:       defaultAckWait,
		nackDelay:     defaultNackDelay,
		dialTimeout:   defaultDialTimeout,
		maxDeliver:    defaultMaxDeliver,
		maxAckPending: defaultMaxAckPending,
		concurrency:   defaultConcurrency,
		streams:       streamsCreate,
	}
	opts := cfg.Options
	// Sorted, so the first problem reported does not depend on map order.
	keys := make([]string, 0, len(opts))
	for k := range opts {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if !knownOptions[k] {
			known := make([]string, 0, len(knownOptions))
			for o := range knownOptions {
				known = append(known, o)
			}
			sort.Strings(known)
			return s, optErr(k, "unknown option of broker kind %q (known: %s)", brokers.KindNATS, strings.Join(known, ", "))
		}
	}
	str := func(key string) (string, bool) {
		v, ok := opts[key]
		v = strings.TrimSpace(v)
		return v, ok && v != ""
	}
	dur := func(key string, dst *time.Duration, allowNegative bool) error {
		v, ok := str(key)
		if !ok {
			return nil
		}
		d, err := time.ParseDuration(v)
		if err != nil {
			return optErr(key, "must be a duration like 500ms or 30s, got %q", v)
		}
		if d == 0 || (d < 0 && !allowNegative) {
			return optErr(key, "must be positive, got %q", v)
		}
		*dst = d
		return nil
	}
	integer := func(key string, dst *int, lo, hi int) error {
		v, ok := str(key)
		if !ok {
			return nil
		}
		n, err := strconv.Atoi(v)
		if err != nil || n < lo || n > hi {
			return optErr(key, "must be an integer from %d to %d, got %q", lo, hi, v)
		}
		*dst = n
		return nil
	}

	if v, ok := str(optURL); ok {
		if err := checkURL(v); err != nil {
			return s, err
		}
		s.url = v
	}
	s.user, _ = str(optUser)
	s.password, _ = str(optPassword)
	s.token, _ = str(optToken)
	s.credsFile, _ = str(optCredsFile)
	switch {
	case s.password != "" && s.user == "":
		return s, optErr(optUser, "is required with %s", optPassword)
	case s.token != "" && s.user != "":
		return s, optErr(optToken, "cannot be combined with %s/%s", optUser, optPassword)
	}
	if s.credsFile != "" {
		if _, err := os.Stat(s.credsFile); err != nil {
			return s, &framework.ConfigError{Field: "options." + optCredsFile, Reason: "cannot be read", Err: err}
		}
	}
	if v, ok := str(optDurable); ok {
		if !durablePattern.MatchString(v) {
			return s, optErr(optDurable, "must be 1-200 letters, digits, '_' or '-' (a JetStream durable name), got %q", v)
		}
		s.durable = v
	}
	if v, ok := str(optSubjectPrefix); ok {
		if err := checkSubject(v, true); err != nil {
			return s, optErr(optSubjectPrefix, "%v", err)
		}
		s.subjectPrefix = v
	}
	if v, ok := str(optStreams); ok {
		v = strings.ToLower(v)
		if v != streamsCreate && v != streamsRequire {
			return s, optErr(optStreams, "must be %q or %q, got %q", streamsCreate, streamsRequire, v)
		}
		s.streams = v
	}
	for _, err := range []error{
		dur(optAckWait, &s.ackWait, false),
		dur(optNackDelay, &s.nackDelay, true),
		dur(optDialTimeout, &s.dialTimeout, true),
		integer(optMaxAckPending, &s.maxAckPending, 1, 1<<20),
		integer(optConcurrency, &s.concurrency, 1, maxConcurrency),
	} {
		if err != nil {
			return s, err
		}
	}
	if v, ok := str(optMaxDeliver); ok {
		n, err := strconv.Atoi(v)
		if err != nil || n == 0 || n < -1 {
			return s, optErr(optMaxDeliver, "must be -1 (unlimited) or a positive integer, got %q", v)
		}
		s.maxDeliver = n
	}
	if s.ackWait < time.Second {
		// In-progress signals go every half ack wait; below a second
		// they would be most of the traffic, and a crashed consumer's
		// messages come back fast enough at a second.
		return s, optErr(optAckWait, "must be at least 1s, got %s", s.ackWait)
	}
	return s, nil
}

// checkURL refuses a URL nats.Connect could not use, without quoting it
// (it may hold a password: url.Parse's error would print it whole).
func checkURL(raw string) error {
	for _, one := range strings.Split(raw, ",") {
		u, err := url.Parse(strings.TrimSpace(one))
		if err != nil {
			return optErr(optURL, "is not a URL")
		}
		switch u.Scheme {
		case "nats", "tls", "ws", "wss":
		default:
			return optErr(optURL, "must be nats://host:port (or tls://, ws://, wss://), comma separated for a cluster")
		}
		if u.Host == "" {
			return optErr(optURL, "has no host")
		}
	}
	return nil
}

// errBadSubject is wrapped by the errors of subjects NATS cannot carry.
var errBadSubject = errors.New("not a NATS subject")

// checkSubject checks a subject (or, with prefix, the start of one):
// printable, no whitespace, no wildcard, no empty token.
func checkSubject(s string, prefix bool) error {
	if s == "" {
		return fmt.Errorf("%w: empty", errBadSubject)
	}
	for _, r := range s {
		if r <= ' ' || r == 0x7f || r == '*' || r == '>' {
			return fmt.Errorf("%w: %q holds whitespace, a control character or a wildcard (* >)", errBadSubject, s)
		}
	}
	body := s
	if prefix {
		body = strings.TrimSuffix(s, ".") // "prod." is a prefix: the topic ends the token
	}
	for _, tok := range strings.Split(body, ".") {
		if tok == "" {
			return fmt.Errorf("%w: %q has an empty token (a leading, trailing or double '.')", errBadSubject, s)
		}
	}
	return nil
}

// subject is the NATS subject of a Watermill topic.
func (s settings) subject(topic string) (string, error) {
	subj := s.subjectPrefix + topic
	if err := checkSubject(subj, false); err != nil {
		return "", fmt.Errorf("brokers/nats: topic %q: %w", topic, err)
	}
	return subj, nil
}
