package amqp_test

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/brokers/amqp"
)

// TestCloseLeavesNoConnection: a Subscriber or Publisher closed right after
// it was made leaves no connection to RabbitMQ behind. watermill-amqp's
// connection wrapper watches its connection from a goroutine of its own;
// when Close closed the connection before that goroutine had registered
// for the close notification, it saw the notification and its own stop
// signal at once, and half the time reconnected: a new connection nobody
// closed. The console, which opens a subscriber for each horizon check,
// leaked one now and then (found by goleak in CI).
//
// The race needs the watcher goroutine to be late, so the test makes many
// closes: under -race, the suite's mode, 2 or 3 of these 3,000 leaked
// before the fix.
func TestCloseLeavesNoConnection(t *testing.T) {
	t.Parallel()
	proxy := startProxy(t, "127.0.0.1:0", "127.0.0.1:5672")
	t.Cleanup(func() { _ = proxy.Close() })
	cfg := testConfig()
	cfg.URL = proxy.URL()
	const workers, rounds = 3, 500
	// Made and closed at once, a Subscriber, then a Publisher.
	openClose := []func() error{
		func() error {
			sub, err := amqp.NewSubscriber(context.Background(), cfg, nil)
			if err != nil {
				return err
			}
			return sub.Close()
		},
		func() error {
			pub, err := amqp.NewPublisher(context.Background(), cfg, nil)
			if err != nil {
				return err
			}
			return pub.Close()
		},
	}
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range rounds {
				for _, f := range openClose {
					if err := f(); err != nil {
						errs <- err
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	// A leaked connection stays open: its heartbeats keep it alive.
	require.Eventually(t, func() bool { return proxy.open.Load() == 0 }, 15*time.Second, 20*time.Millisecond,
		"%d of %d connections still open after every Close", proxy.open.Load(), proxy.accepted.Load())
	// Reconnects that raced Close still happen; Close closes them.
	t.Logf("%d reconnects raced Close, all closed", proxy.accepted.Load()-int64(len(openClose)*workers*rounds))
}

// TestCloseSeesTheWatcherStop: Close reads watermill-amqp's connection
// watcher from its log lines. If the lines it relies on change, Close can
// no longer tell when the watcher ends (it gives up after 5 s and may leave
// a connection open): this says so at once.
func TestCloseSeesTheWatcherStop(t *testing.T) {
	t.Parallel()
	sub, err := amqp.NewSubscriber(context.Background(), testConfig(), nil)
	require.NoError(t, err)
	connected, stopped := amqp.WatcherState(sub)
	require.True(t, connected, `"Connected to AMQP" was not seen`)
	require.False(t, stopped)
	require.NoError(t, sub.Close())
	_, stopped = amqp.WatcherState(sub)
	require.True(t, stopped, `Close returned without seeing "Stopping handleConnectionClose"`)
}

// lineLogger records the messages logged to it.
type lineLogger struct {
	mu   sync.Mutex
	msgs []string
}

func (l *lineLogger) add(msg string) {
	l.mu.Lock()
	l.msgs = append(l.msgs, msg)
	l.mu.Unlock()
}

func (l *lineLogger) seen(msg string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Contains(l.msgs, msg)
}

func (l *lineLogger) Error(msg string, _ error, _ watermill.LogFields) { l.add(msg) }
func (l *lineLogger) Info(msg string, _ watermill.LogFields)           { l.add(msg) }
func (l *lineLogger) Debug(msg string, _ watermill.LogFields)          { l.add(msg) }
func (l *lineLogger) Trace(msg string, _ watermill.LogFields)          { l.add(msg) }
func (l *lineLogger) With(watermill.LogFields) watermill.LoggerAdapter { return l }

// TestCloseWhileReconnecting: a Publisher closed while it waits to retry a
// lost connection returns at once, and when RabbitMQ is back before that
// retry, the connection the retry makes is closed too.
func TestCloseWhileReconnecting(t *testing.T) {
	t.Parallel()
	first := startProxy(t, "127.0.0.1:0", "127.0.0.1:5672")
	addr := first.l.Addr().String()
	cfg := testConfig()
	cfg.URL = first.URL()
	// Long enough to close the publisher and bring RabbitMQ back between
	// two attempts (backoff randomization is 0.5: at least 500 ms).
	cfg.ReconnectInitialInterval, cfg.ReconnectMaxInterval = time.Second, time.Second
	log := &lineLogger{}
	pub, err := amqp.NewPublisher(context.Background(), cfg, log)
	require.NoError(t, err)

	require.NoError(t, first.Close()) // the connection is lost
	require.Eventually(t, func() bool { return log.seen("Cannot reconnect to AMQP, retrying") }, 10*time.Second, 5*time.Millisecond,
		"the first retry failed; the next one is a backoff away")
	require.NoError(t, pub.Close())
	again := startProxy(t, addr, "127.0.0.1:5672")
	t.Cleanup(func() { _ = again.Close() })

	require.Eventually(t, func() bool { return again.accepted.Load() == 1 }, 10*time.Second, 5*time.Millisecond,
		"the retry after Close reconnects")
	require.Eventually(t, func() bool { return again.open.Load() == 0 }, 10*time.Second, 5*time.Millisecond,
		"the connection the retry made is closed")
}
