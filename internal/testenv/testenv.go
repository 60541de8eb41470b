// Package testenv holds what the suite's tests share about their

// environment. Mostly it decides what a test does when the machine lacks
// something it needs (a command-line tool, a server setting). On a developer's machine
// the test skips, saying what is missing; under CI it fails, because the CI
// machine is set up to provide everything the suite uses (rabbitmqctl ships
// with the rabbitmq-server package it runs, its Postgres has ssl = on), so a
// missing piece there is a broken machine, and a skip would let the suite
// pass with the tests it exists for never run.
package testenv

import (
	"bytes"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"testing"

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

// CI reports whether the tests run under continuous integration: the CI
// environment variable is set to a true value (CI=true on every common CI
// service; .ci/run runs under it).
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
		return
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
// goroutine is left, other than the two that end on their own schedule
// and opts.
func VerifyTestMain(m *testing.M, opts ...goleak.Option) {
	goleak.VerifyTestMain(m, append([]goleak.Option{
		// pgx's pool health checker ends asynchronously after Close.
		goleak.IgnoreTopFunction("github.com/jackc/pgx/v5/pgxpool.(*Pool).backgroundHealthCheck"),
		// Sarama's metrics (go-metrics) start one process-wide meter
		// goroutine on first use (meter.go:46) and never stop it.
		goleak.IgnoreTopFunction("github.com/rcrowley/go-metrics.(*meterArbiter).tick"),
	}, opts...)...)
}
