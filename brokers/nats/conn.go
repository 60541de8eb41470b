package nats

import (
	"errors"
	"fmt"
	"regexp"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	natsgo "github.com/nats-io/nats.go"

	"github.com/claimtx/claimtx/brokers/internal/warnlog"
	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/internal/natsmsg"
)

// Reconnect timing of an established connection. nats.go resubscribes
// (the pull subscriptions' inboxes included) and flushes what it buffered
// once it is back.
const (
	reconnectWait = 500 * time.Millisecond
	dialBackoffLo = 100 * time.Millisecond
	dialBackoffHi = 2 * time.Second
)

// isAuthError reports whether the server refused the credentials, which
// waiting cannot fix.
func isAuthError(err error) bool {
	return errors.Is(err, natsgo.ErrAuthorization) || errors.Is(err, natsgo.ErrAuthExpired) ||
		errors.Is(err, natsgo.ErrAuthRevoked) || errors.Is(err, natsgo.ErrAccountAuthExpired)
}

// dial connects to NATS, retrying with backoff until s.DialTimeout has
// passed (a single attempt when it is negative), because nats.Connect
// fails at once while the server is still starting. A refused credential
// is a *framework.AuthError at once. Once connected, the connection
// reconnects forever (MaxReconnects -1): a consumer whose connection gave
// up would stay up and consume nothing; /healthz reports the outage
// instead (the subscriber's IsConnected).
//
// denied, when not nil, records the subjects the server refused a publish
// to for lack of permission. It returns the JetStream context on the
// connection too, which is what both the publisher and the subscriber use.
func dial(s settings, logger watermill.LoggerAdapter, role string, denied *deniedSubjects) (*natsgo.Conn, natsgo.JetStreamContext, error) {
	opts := []natsgo.Option{
		natsgo.Name("claimtx-" + role),
		natsgo.MaxReconnects(-1),
		natsgo.ReconnectWait(reconnectWait),
		natsgo.DisconnectErrHandler(func(_ *natsgo.Conn, err error) {
			if err != nil {
				warnlog.Log(logger, "NATS connection lost, reconnecting", watermill.LogFields{"role": role, "err": err.Error()})
			}
		}),
		natsgo.ReconnectHandler(func(*natsgo.Conn) {
			logger.Info("NATS connection re-established", watermill.LogFields{"role": role})
		}),
		natsgo.ErrorHandler(func(_ *natsgo.Conn, sub *natsgo.Subscription, err error) {
			denied.record(err)
			fields := watermill.LogFields{"role": role}
			if sub != nil {
				fields["subject"] = sub.Subject
			}
			logger.Error("NATS asynchronous error", err, fields)
		}),
	}
	opts = append(opts, natsmsg.Auth(s.User, s.Password, s.Token, s.CredsFile)...)
	deadline := time.Now().Add(s.DialTimeout)
	wait := dialBackoffLo
	for attempt := 1; ; attempt++ {
		nc, err := natsgo.Connect(s.URL, opts...)
		if err == nil {
			js, err := nc.JetStream()
			if err != nil {
				nc.Close()
				return nil, nil, fmt.Errorf("brokers/nats: JetStream context: %w", err)
			}
			return nc, js, nil
		}
		if isAuthError(err) {
			return nil, nil, &framework.AuthError{Dependency: "NATS", Err: err}
		}
		if s.DialTimeout < 0 || time.Now().Add(wait).After(deadline) {
			// nats.go's connect errors do not quote the URL.
			return nil, nil, fmt.Errorf("connect to NATS (%d attempts): %w", attempt, err)
		}
		warnlog.Log(logger, "NATS not reachable yet, retrying", watermill.LogFields{
			"role": role, "attempt": attempt, "retry_in": wait.String(), "err": err.Error(),
		})
		time.Sleep(wait)
		wait = min(2*wait, dialBackoffHi)
	}
}

// deniedSubjects remembers when the server last refused a publish to each
// subject for lack of permission. The server says so asynchronously (an
// -ERR after the PUB), and a JetStream publish then only times out waiting
// for its acknowledgement: the record is how Publish tells that timeout
// from one a later attempt may get past.
type deniedSubjects struct {
	mu sync.Mutex
	at map[string]time.Time
}

// publishDenied finds the subject in the server's "Permissions Violation
// for Publish to "SUBJECT"" error.
var publishDenied = regexp.MustCompile(`Permissions Violation for Publish to "([^"]+)"`)

func (d *deniedSubjects) record(err error) {
	if d == nil || err == nil {
		return
	}
	// nats.go has no sentinel for it (nats.go v1.37: "nats: " + the
	// server's -ERR text), so the server's wording is matched.
	m := publishDenied.FindStringSubmatch(err.Error())
	if m == nil {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.at == nil {
		d.at = map[string]time.Time{}
	}
	d.at[m[1]] = time.Now()
}

// since reports whether a publish to subject was refused at or after t.
func (d *deniedSubjects) since(subject string, t time.Time) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	at, ok := d.at[subject]
	return ok && !at.Before(t)
}
