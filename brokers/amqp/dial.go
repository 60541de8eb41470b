package amqp

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/claimtx/claimtx/brokers"
	"github.com/claimtx/claimtx/brokers/internal/defaults"
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

// dial opens a watermill-amqp connection, retrying with backoff up to
// DialTimeout: wamqp.NewConnection tries once, and a service started before
// RabbitMQ would exit.
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
		fail := func(err error) error {
			return &DialError{URL: redacted, Attempts: attempt, Elapsed: time.Since(start), Err: err}
		}
		if accessRefused(err) {
			return nil, fail(&framework.AuthError{Dependency: "RabbitMQ", Err: err})
		}
		if cfg.DialTimeout < 0 {
			return nil, fail(err)
		}
		warnlog.Log(logger, "RabbitMQ not reachable yet, retrying", watermill.LogFields{
			"dependency": "RabbitMQ", "url": redacted, "attempt": attempt, "retry_in": backoff.String(), "err": err.Error(),
		})
		if !wait.For(backoff, ctx.Done()) {
			return nil, fail(fmt.Errorf("%w (last error: %w)", ctx.Err(), err))
		}
		backoff = min(2*backoff, cfg.ReconnectMaxInterval)
	}
}

// conn is watermill-amqp's connection wrapper with a Close that leaves no
// connection behind. v3.0.2's watcher goroutine reconnects when it sees the
// close notification before its stop signal (a wrapper closed right after
// it was made, or while it waits to retry a lost connection), and nobody
// closes that connection. Its log lines are the only view of its state, so
// watcher reads them, and Close closes what the watcher left.
type conn struct {
	*wamqp.ConnectionWrapper
	w *watcher
}

// Close closes the wrapper and, once its watcher has ended, the connection
// it left. With the connection lost already, the watcher ends only on its
// next retry (up to ReconnectMaxInterval away): that connection is closed
// in the background.
func (c *conn) Close() error {
	lost := !c.w.connected.Load()
	err := c.ConnectionWrapper.Close()
	left := make(chan error, 1)
	go func() {
		<-c.w.stopped
		var err error
		if ac := c.Connection(); ac != nil && !ac.IsClosed() {
			err = ac.Close()
		}
		left <- err
	}()
	if lost {
		return err
	}
	select {
	case e := <-left:
		return errors.Join(err, e)
	case <-time.After(5 * time.Second): // the watcher stops at once or after one reconnect
		return err
	}
}

// watcher is the logger a ConnectionWrapper is made with: it forwards every
// line and follows the watcher goroutine through them.
// TestCloseSeesTheWatcherStop and TestCloseWhileReconnecting fail if the
// lines change.
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

// accessRefused: RabbitMQ refused the credentials, the vhost or a
// permission (403).
func accessRefused(err error) bool {
	var aerr *amqp091.Error
	return errors.As(err, &aerr) && aerr.Code == amqp091.AccessRefused
}

// waitConnected waits until conn is connected again after a drop, bounded
// like the initial dial.
func waitConnected(ctx context.Context, cfg brokers.AMQPConfig, conn *conn) error {
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

// link is what NewSubscriber and NewPublisher both start from.
type link struct {
	cfg    brokers.AMQPConfig
	wc     wamqp.Config
	logger watermill.LoggerAdapter
	conn   *conn
}

// connect validates cfg, applies its defaults and dials.
func connect(ctx context.Context, cfg brokers.AMQPConfig, logger watermill.LoggerAdapter) (link, error) {
	if err := validate(cfg); err != nil {
		return link{}, err
	}
	l := link{cfg: defaults.Apply(cfg), logger: logger}
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
// here does, on a channel of its own: a refusal closes its channel.
func (l *link) declareQueue(topic string) error {
	ch, err := l.channel()
	if err != nil {
		return err
	}
	defer func() { _ = ch.Close() }()
	q := l.wc.Queue
	if _, err := ch.QueueDeclare(q.GenerateName(topic), q.Durable, q.AutoDelete, q.Exclusive, q.NoWait, q.Arguments); err != nil {
		return declareError(l.cfg, topic, err)
	}
	return nil
}

func (l *link) channel() (*amqp091.Channel, error) {
	ac := l.conn.Connection()
	if ac == nil {
		return nil, errors.New("not connected to AMQP")
	}
	ch, err := ac.Channel()
	if err != nil {
		return nil, fmt.Errorf("open channel: %w", err)
	}
	return ch, nil
}

// declareError turns a declaration refused because the queue exists with
// other arguments (406 PRECONDITION_FAILED, "inequivalent arg") into a
// *framework.ConfigError naming the setting and the two ways out, wrapping
// RabbitMQ's error (which names both values). Other errors pass as they
// are.
func declareError(c brokers.AMQPConfig, queue string, err error) error {
	var aerr *amqp091.Error
	if !errors.As(err, &aerr) || aerr.Code != amqp091.PreconditionFailed || !strings.Contains(aerr.Reason, "inequivalent arg") {
		return err
	}
	field, setting := "queue_arguments", "queue_arguments"
	switch {
	case strings.Contains(aerr.Reason, "'"+argQueueType+"'"):
		field, setting = "queue_type", "queue_type (AMQP_QUEUE_TYPE)"
	case strings.Contains(aerr.Reason, "'"+argDeliveryLimit+"'"):
		field, setting = "delivery_limit", "delivery_limit (AMQP_DELIVERY_LIMIT)"
	}
	return &framework.ConfigError{
		Field: field,
		Reason: fmt.Sprintf("queue %q already exists with other arguments than this configuration declares "+
			"(queue_type %q, delivery_limit %d, queue_arguments %v), and RabbitMQ cannot change them in place: "+
			"either set %s to what the queue has, or migrate the queue: stop its consumers, let it drain "+
			"(or move its messages elsewhere), delete it (rabbitmqctl delete_queue %s) and start the consumers "+
			"with the new configuration, which declares it anew; RabbitMQ says",
			queue, c.QueueType, c.DeliveryLimit, c.QueueArguments, setting, queue),
		Err: err,
	}
}
