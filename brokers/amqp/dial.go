package amqp

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/claimtx/claimtx/brokers/internal/secret"
	"github.com/claimtx/claimtx/brokers/internal/warnlog"
	"github.com/claimtx/claimtx/framework"
)

// DialError is returned when the start-up connection attempts give up.
type DialError struct {
	URL      string        // redacted
	Attempts int           // connection attempts made
	Elapsed  time.Duration // time spent trying
	Err      error         // the last attempt's error, or the context's
}

func (e *DialError) Error() string {
	return fmt.Sprintf("brokers/amqp: cannot connect to %s: gave up after %d attempt(s) in %s: %v",
		e.URL, e.Attempts, e.Elapsed.Round(time.Millisecond), e.Err)
}

func (e *DialError) Unwrap() error { return e.Err }

// dial opens a watermill-amqp connection, retrying with backoff.
// wamqp.NewConnection tries exactly once (connection.go: connect() in
// NewConnection returns the dial error), so a service that starts before
// RabbitMQ would exit; here it waits up to cfg.DialTimeout instead.
func dial(ctx context.Context, cfg Config, wc wamqp.Config, logger watermill.LoggerAdapter) (*wamqp.ConnectionWrapper, error) {
	start := time.Now()
	if cfg.DialTimeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, cfg.DialTimeout)
		defer cancel()
	}
	redacted := secret.RedactURL(cfg.URL)
	wait := cfg.ReconnectInitialInterval
	for attempt := 1; ; attempt++ {
		conn, err := wamqp.NewConnection(wc.Connection, logger)
		if err == nil {
			return conn, nil
		}
		if permanentDialError(err) {
			// Waiting cannot fix refused credentials: name it, at once.
			return nil, &DialError{URL: redacted, Attempts: attempt, Elapsed: time.Since(start),
				Err: &framework.AuthError{Dependency: "RabbitMQ", Err: err}}
		}
		if cfg.DialTimeout < 0 {
			return nil, &DialError{URL: redacted, Attempts: attempt, Elapsed: time.Since(start), Err: err}
		}
		warnlog.Log(logger, "RabbitMQ not reachable yet, retrying", watermill.LogFields{
			"dependency": "RabbitMQ", "url": redacted, "attempt": attempt, "retry_in": wait.String(), "err": err.Error(),
		})
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, &DialError{URL: redacted, Attempts: attempt, Elapsed: time.Since(start),
				Err: fmt.Errorf("%w (last error: %w)", ctx.Err(), err)}
		case <-t.C:
		}
		wait = min(2*wait, cfg.ReconnectMaxInterval)
	}
}

// permanentDialError tells errors that waiting cannot fix: RabbitMQ refused
// the credentials or the vhost (AMQP reply code 403).
func permanentDialError(err error) bool {
	var aerr *amqp091.Error
	return errors.As(err, &aerr) && aerr.Code == amqp091.AccessRefused
}

// waitConnected waits until conn is connected again after a drop, bounded
// like the initial dial. watermill-amqp's Subscribe and Publish fail at once
// with "not connected" during its reconnect loop.
func waitConnected(ctx context.Context, cfg Config, conn *wamqp.ConnectionWrapper) error {
	if conn.IsConnected() {
		return nil
	}
	if cfg.DialTimeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, cfg.DialTimeout)
		defer cancel()
	}
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for !conn.IsConnected() {
		if conn.Closed() {
			return errors.New("brokers/amqp: connection closed")
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("brokers/amqp: not connected to RabbitMQ: %w", ctx.Err())
		case <-tick.C:
		}
	}
	return nil
}

// connect is the start-up both NewSubscriber and NewPublisher share:
// validate, apply defaults, derive watermill-amqp's config and dial with
// retries.
func connect(ctx context.Context, cfg Config, logger watermill.LoggerAdapter) (Config, wamqp.Config, *wamqp.ConnectionWrapper, watermill.LoggerAdapter, error) {
	if err := cfg.Validate(); err != nil {
		return cfg, wamqp.Config{}, nil, nil, err
	}
	cfg = cfg.withDefaults()
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	wc, err := cfg.watermillConfig()
	if err != nil {
		return cfg, wc, nil, nil, err
	}
	conn, err := dial(ctx, cfg, wc, logger)
	return cfg, wc, conn, logger, err
}
