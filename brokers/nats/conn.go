package nats

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	natsgo "github.com/nats-io/nats.go"

	"github.com/claimtx/claimtx/brokers/internal/wait"
	"github.com/claimtx/claimtx/brokers/internal/warnlog"
	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/internal/natsmsg"
)

// Reconnect timing; nats.go resubscribes and flushes once it is back.
const (
	reconnectWait = 500 * time.Millisecond
	dialBackoffLo = 100 * time.Millisecond
	dialBackoffHi = 2 * time.Second
)

// dial connects to NATS, retrying with backoff until s.DialTimeout (once
// when negative): nats.Connect fails at once while the server starts. A
// refused credential is a *framework.AuthError at once. Once connected it
// reconnects forever: a consumer whose connection gave up would stay up
// and consume nothing, where /healthz reports the outage. denied, when not
// nil, records the subjects a publish was refused to.
func dial(ctx context.Context, s settings, logger watermill.LoggerAdapter, role string, denied *deniedSubjects) (*natsgo.Conn, natsgo.JetStreamContext, error) {
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
	delay := dialBackoffLo
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
		if errors.Is(err, natsgo.ErrAuthorization) || errors.Is(err, natsgo.ErrAuthExpired) ||
			errors.Is(err, natsgo.ErrAuthRevoked) || errors.Is(err, natsgo.ErrAccountAuthExpired) {
			return nil, nil, &framework.AuthError{Dependency: "NATS", Err: err}
		}
		if s.DialTimeout < 0 || time.Now().Add(delay).After(deadline) {
			return nil, nil, fmt.Errorf("connect to NATS (%d attempts): %w", attempt, err)
		}
		warnlog.Log(logger, "NATS not reachable yet, retrying", watermill.LogFields{
			"role": role, "attempt": attempt, "retry_in": delay.String(), "err": err.Error(),
		})
		if !wait.For(delay, ctx.Done()) {
			return nil, nil, fmt.Errorf("connect to NATS (%d attempts): %w (last error: %w)", attempt, ctx.Err(), err)
		}
		delay = min(2*delay, dialBackoffHi)
	}
}

// deniedSubjects remembers when the server last refused a publish to each
// subject (permissions), subject -> time.Time. It says so asynchronously,
// and the JetStream publish only times out: this is how Publish tells that
// timeout apart.
type deniedSubjects struct{ sync.Map }

// publishDenied matches the server's -ERR text: nats.go has no sentinel.
var publishDenied = regexp.MustCompile(`Permissions Violation for Publish to "([^"]+)"`)

func (d *deniedSubjects) record(err error) {
	if d == nil || err == nil {
		return
	}
	if m := publishDenied.FindStringSubmatch(err.Error()); m != nil {
		d.Store(m[1], time.Now())
	}
}

func (d *deniedSubjects) since(subject string, t time.Time) bool {
	at, ok := d.Load(subject)
	return ok && !at.(time.Time).Before(t)
}
