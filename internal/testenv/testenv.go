// Package testenv holds what the suite's tests share about their
// environment. Mostly it decides what a test does when the machine lacks
// something it needs (a tool, a server setting): on a developer's machine the
// test skips, saying what is missing; under CI it fails, because the CI
// machine provides everything the suite uses (rabbitmqctl, Postgres with ssl
// = on), so a missing piece is a broken machine, and a skip would let the
// suite pass with the tests it exists for never run.
package testenv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// Output collects a subprocess's stdout and stderr while it runs (two
// pipes writing at once) and can be read meanwhile.
type Output struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (o *Output) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.buf.Write(p)
}

func (o *Output) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.buf.String()
}

// CI reports whether the tests run under continuous integration: CI is set
// to a true value (as on every common CI service, and under .ci/run).
func CI() bool {
	ci, err := strconv.ParseBool(os.Getenv("CI"))
	return err == nil && ci
}

// SkipOrFail skips the test with the given reason, or fails it under CI
// (see the package comment).
func SkipOrFail(t testing.TB, format string, args ...any) {
	t.Helper()
	if CI() {
		t.Fatalf("testenv: CI must not skip this test: "+format, args...)
		return // a fake testing.TB's Fatalf returns
	}
	t.Skipf(format, args...)
}

// RequireTool returns the path of the named command, or skips the test
// when it is not installed (fails it under CI).
func RequireTool(t testing.TB, name string) string {
	t.Helper()
	path, err := exec.LookPath(name)
	if err != nil {
		SkipOrFail(t, "%s not installed (%v)", name, err)
	}
	return path
}

// VerifyTestMain runs a package's tests and then fails the run if any
// goroutine is left, other than the two that end on their own and opts.
func VerifyTestMain(m *testing.M, opts ...goleak.Option) {
	goleak.VerifyTestMain(m, append([]goleak.Option{
		// pgx's pool health checker ends asynchronously after Close.
		goleak.IgnoreTopFunction("github.com/jackc/pgx/v5/pgxpool.(*Pool).backgroundHealthCheck"),
		// Sarama's metrics (go-metrics) start one process-wide meter
		// goroutine on first use (meter.go:46) and never stop it.
		goleak.IgnoreTopFunction("github.com/rcrowley/go-metrics.(*meterArbiter).tick"),
	}, opts...)...)
}

// SetEnv sets each NAME=value of env for the rest of t (t.Setenv): the
// config tests write their environments as a shell would.
func SetEnv(t testing.TB, env ...string) {
	t.Helper()
	for _, kv := range env {
		name, value, _ := strings.Cut(kv, "=")
		t.Setenv(name, value)
	}
}

// UnsetEnvPrefix sets every variable whose name starts with prefix empty
// (which the config loaders count as unset) for the rest of t, so that the
// runner's own environment cannot leak into a test.
func UnsetEnvPrefix(t testing.TB, prefix string) {
	t.Helper()
	for _, kv := range os.Environ() {
		if name, _, _ := strings.Cut(kv, "="); strings.HasPrefix(name, prefix) {
			t.Setenv(name, "")
		}
	}
}

// CloseAtEnd returns a function that registers closers to close when t
// ends, from any goroutine: Watermill's Pub/Sub suite (pubsub/tests) leaks
// the subscribers its multiplier builds, so the adapters' conformance runs
// close everything they built once the suite is done.
func CloseAtEnd(t testing.TB) func(...io.Closer) {
	var mu sync.Mutex
	var closers []io.Closer
	t.Cleanup(func() {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range closers {
			_ = c.Close()
		}
	})
	return func(cs ...io.Closer) {
		mu.Lock()
		defer mu.Unlock()
		closers = append(closers, cs...)
	}
}

// SubscribeReceive subscribes sub to topic for the rest of t and waits for
// the first message (see Receive); the channel gives the ones after it.
func SubscribeReceive(t testing.TB, sub message.Subscriber, topic string, timeout time.Duration) (*message.Message, <-chan *message.Message) {
	t.Helper()
	msgs, err := sub.Subscribe(t.Context(), topic)
	require.NoError(t, err)
	return Receive(t, msgs, timeout), msgs
}

// Receive waits for one message from a subscription or fails the test; a
// closed channel fails it too, since the tests that wait expect a message.
func Receive(t testing.TB, ch <-chan *message.Message, timeout time.Duration) *message.Message {
	t.Helper()
	select {
	case m, ok := <-ch:
		require.True(t, ok, "messages channel closed")
		return m
	case <-time.After(timeout):
		t.Fatalf("no message within %s", timeout)
		return nil
	}
}

var unsafeChars = regexp.MustCompile(`[^a-zA-Z0-9_-]+`)

// UniqueName is a queue, topic, group or durable name unique to this test
// and run, so tests run in parallel and rerun on a dirty broker. The test's
// own name is cut to its last maxName characters, as brokers bound names
// (NATS durables the tightest).
func UniqueName(t testing.TB, maxName int) string {
	name := unsafeChars.ReplaceAllString(t.Name(), "_")
	if len(name) > maxName {
		name = name[len(name)-maxName:]
	}
	return "claimtx-test-" + strings.ToLower(name) + randomName("-")[:9] // 8 hex digits
}

// QueueDepth returns the ready messages of an AMQP queue, 0 if it does not
// exist, on a channel of its own (a missing queue closes it).
func QueueDepth(t testing.TB, conn *amqp.Connection, queue string) int {
	t.Helper()
	ch, err := conn.Channel()
	require.NoError(t, err)
	defer func() { _ = ch.Close() }()
	q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	var aerr *amqp.Error
	if errors.As(err, &aerr) && aerr.Code == amqp.NotFound {
		return 0
	}
	require.NoError(t, err)
	return q.Messages
}

// CloseAMQPConnections makes RabbitMQ close (with rabbitmqctl) the
// connections whose connection_name (brokers.AMQPConfig.ConnectionName) is
// one of names, and only those: they get CONNECTION_FORCED, as on a broker
// restart. It returns how many it closed.
func CloseAMQPConnections(ctx context.Context, reason string, names ...string) (int, error) {
	out, err := exec.CommandContext(ctx, "rabbitmqctl", "list_connections", "--quiet", "--no-table-headers", "pid", "client_properties").CombinedOutput()
	if err != nil {
		return 0, fmt.Errorf("rabbitmqctl list_connections: %w: %s", err, out)
	}
	var pids []string
	for _, line := range strings.Split(string(out), "\n") {
		pid, props, ok := strings.Cut(line, "\t")
		if ok && slices.ContainsFunc(names, func(n string) bool { return strings.Contains(props, `{"connection_name","`+n+`"}`) }) {
			pids = append(pids, pid)
		}
	}
	// At once: each rabbitmqctl takes seconds to start, and the
	// connections should drop together, as on a broker restart.
	errs := make([]error, len(pids))
	var wg sync.WaitGroup
	for i, pid := range pids {
		wg.Go(func() {
			// pid is a connection pid as rabbitmqctl itself printed it.
			if out, err := exec.CommandContext(ctx, "rabbitmqctl", "close_connection", pid, reason).CombinedOutput(); err != nil { //nolint:gosec // see above
				errs[i] = fmt.Errorf("rabbitmqctl close_connection: %w: %s", err, out)
			}
		})
	}
	wg.Wait()
	return len(pids), errors.Join(errs...)
}
