package amqp

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/claimtx/claimtx/brokers"
	"github.com/claimtx/claimtx/brokers/internal/wait"
	"github.com/claimtx/claimtx/brokers/internal/warnlog"
	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/internal/config"
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
func dial(ctx context.Context, cfg brokers.AMQPConfig, wc wamqp.Config, logger watermill.LoggerAdapter) (*conn, error) {
	start := time.Now()
	if cfg.DialTimeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, cfg.DialTimeout)
		defer cancel()
	}
	w := &watcher{LoggerAdapter: logger, stopped: make(chan struct{})}
	redacted := config.RedactURL(cfg.URL)
	backoff := cfg.ReconnectInitialInterval
	for attempt := 1; ; attempt++ {
		wrapper, err := wamqp.NewConnection(wc.Connection, w)
		if err == nil {
			return &conn{ConnectionWrapper: wrapper, w: w}, nil
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
			"dependency": "RabbitMQ", "url": redacted, "attempt": attempt, "retry_in": backoff.String(), "err": err.Error(),
		})
		if !wait.For(backoff, ctx.Done()) {
			return nil, &DialError{URL: redacted, Attempts: attempt, Elapsed: time.Since(start),
				Err: fmt.Errorf("%w (last error: %w)", ctx.Err(), err)}
		}
		backoff = min(2*backoff, cfg.ReconnectMaxInterval)
	}
}

// conn is watermill-amqp's connection wrapper with a Close that leaves no
// connection to RabbitMQ behind.
//
// The wrapper's watcher goroutine (handleConnectionClose in v3.0.2's
// connection.go) waits for the wrapper's stop signal or the connection's
// close notification, and reconnects on the notification. The wrapper's
// Close sends the stop signal, then closes the connection; when the watcher
// had not registered for the notification yet (a wrapper closed right after
// it was made), it finds both ready, picks one at random, and half the time
// dials a new connection that nobody closes. A wrapper closed while its
// watcher waits to retry a lost connection does the same if the retry
// succeeds. The watcher's log lines are the only view of its state, so the
// watcher type reads them, and Close closes whatever connection the watcher
// leaves when it ends.
type conn struct {
	*wamqp.ConnectionWrapper
	w *watcher
}

// watcherStopWait bounds Close's wait for the watcher, which stops at once
// or after one reconnect to a RabbitMQ that was up a moment ago.
const watcherStopWait = 5 * time.Second

// Close closes the wrapper and, once its watcher has ended, the connection
// the watcher left open, if any. It waits for the watcher unless the
// connection was lost already: then the watcher ends on its next retry,
// after a backoff of up to brokers.AMQPConfig.ReconnectMaxInterval, too long to hold a
// shutdown, and the connection it may leave is closed in the background.
func (c *conn) Close() error {
	lost := !c.w.connected.Load()
	err := c.ConnectionWrapper.Close()
	left := make(chan error, 1)
	go func() {
		<-c.w.stopped
		// Ended, the watcher replaces the connection no more.
		var err error
		if ac := c.Connection(); ac != nil && !ac.IsClosed() {
			err = ac.Close()
		}
		left <- err
	}()
	if lost {
		return err
	}
	t := time.NewTimer(watcherStopWait)
	defer t.Stop()
	select {
	case e := <-left:
		return errors.Join(err, e)
	case <-t.C:
		return err
	}
}

// watcher is the logger a ConnectionWrapper is made with: it forwards every
// line and follows the wrapper's watcher goroutine through the lines of
// watermill-amqp v3.0.2's connection.go. TestCloseSeesTheWatcherStop fails
// if the lines Close relies on change, TestCloseWhileReconnecting if the
// drop's does.
type watcher struct {
	watermill.LoggerAdapter
	connected atomic.Bool // connected, no drop seen since
	stopOnce  sync.Once
	stopped   chan struct{} // closed when the watcher goroutine has ended or parked for good
}

func (w *watcher) Info(msg string, fields watermill.LogFields) {
	if msg == "Connected to AMQP" {
		w.connected.Store(true)
	}
	w.LoggerAdapter.Info(msg, fields)
}

func (w *watcher) Error(msg string, err error, fields watermill.LogFields) {
	switch msg {
	case "Received close notification from AMQP, reconnecting":
		w.connected.Store(false)
	case "AMQP reconnect failed failed": // the wrapper was closed during a reconnect: parked for good
		w.stop()
	}
	w.LoggerAdapter.Error(msg, err, fields)
}

func (w *watcher) Debug(msg string, fields watermill.LogFields) {
	if msg == "Stopping handleConnectionClose" {
		w.stop()
	}
	w.LoggerAdapter.Debug(msg, fields)
}

func (w *watcher) stop() { w.stopOnce.Do(func() { close(w.stopped) }) }

// permanentDialError tells errors that waiting cannot fix: RabbitMQ refused
// the credentials or the vhost (AMQP reply code 403).
func permanentDialError(err error) bool {
	var aerr *amqp091.Error
	return errors.As(err, &aerr) && aerr.Code == amqp091.AccessRefused
}

// waitConnected waits until conn is connected again after a drop, bounded
// like the initial dial. watermill-amqp's Subscribe and Publish fail at once
// with "not connected" during its reconnect loop.
func waitConnected(ctx context.Context, cfg brokers.AMQPConfig, conn *conn) error {
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

// link is what NewSubscriber and NewPublisher both start from: the brokers.AMQPConfig
// with its defaults, watermill-amqp's config derived from it, the logger
// and the connection.
type link struct {
	cfg    brokers.AMQPConfig
	wc     wamqp.Config
	logger watermill.LoggerAdapter
	conn   *conn
}

// connect is the start-up both NewSubscriber and NewPublisher share:
// validate, apply defaults, derive watermill-amqp's config and dial with
// retries.
func connect(ctx context.Context, cfg brokers.AMQPConfig, logger watermill.LoggerAdapter) (link, error) {
	if err := validate(cfg); err != nil {
		return link{}, err
	}
	l := link{cfg: withDefaults(cfg), logger: logger}
	if l.logger == nil {
		l.logger = watermill.NopLogger{}
	}
	var err error
	if l.wc, err = watermillConfig(l.cfg); err != nil {
		return link{}, err
	}
	l.conn, err = dial(ctx, l.cfg, l.wc, l.logger)
	return l, err
}

// declareQueue declares the durable queue named topic as every declaration
// of this adapter does (wc.Queue: the name, durable flag and argument
// table), on a channel of its own: a refused declaration closes the
// channel it was made on. A refusal over arguments is a declareError.
func (l *link) declareQueue(topic string) error {
	ac := l.conn.Connection()
	if ac == nil {
		return errors.New("not connected to AMQP")
	}
	ch, err := ac.Channel()
	if err != nil {
		return fmt.Errorf("open channel: %w", err)
	}
	defer func() { _ = ch.Close() }()
	q := l.wc.Queue
	if _, err := ch.QueueDeclare(q.GenerateName(topic), q.Durable, q.AutoDelete, q.Exclusive, q.NoWait, q.Arguments); err != nil {
		return declareError(l.cfg, topic, err)
	}
	return nil
}
