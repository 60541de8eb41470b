package testenv

import (
	"testing"

	"go.uber.org/goleak"
)

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
