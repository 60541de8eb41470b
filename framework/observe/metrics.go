package observe

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/claimtx/claimtx/framework/internal/metrics"
	"github.com/claimtx/claimtx/middleware"
)

// Metrics records claimtx's outcomes in Prometheus. Labels are the consumer
// name, the Watermill handler name, the outcome and the retry cause; never
// the key, whose cardinality is unbounded.
//
// Wire it with the hooks:
//
//	m, err := observe.NewMetrics(prometheus.DefaultRegisterer)
//	claim.OnOutcome, claim.OnRetry = m.OnOutcome, m.OnRetry
//
// framework/consumer records more through the same collectors: handler
// retries, poison memo errors and refusals, Kafka positions.
//
// The redelivery rate of a consumer is
// rate(claimtx_messages_total{outcome="duplicate"}) / rate(claimtx_messages_total).
type Metrics struct{ m *metrics.Metrics }

// NewMetrics registers claimtx's collectors on reg. Registering twice on
// one registerer is an error (prometheus.AlreadyRegisteredError), as
// Prometheus requires.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m, err := metrics.New(reg)
	if err != nil {
		return nil, err
	}
	return &Metrics{m}, nil
}

// InitConsumer creates the series of one consumer (and Watermill handler
// name) at zero: every outcome, every retry cause, the fingerprint
// mismatches and the histograms. A counter vector exports a series only
// once it has a label set, so without this a dashboard shows "no data"
// instead of 0 until the first event, and rate() over a series that
// appears mid-window misses its first increment. framework/consumer calls
// it when a consumer is built; call it when you wire the hooks yourself.
func (m *Metrics) InitConsumer(consumer, handler string) { m.m.InitConsumer(consumer, handler) }

// OnOutcome records one Result; call it once per settled message (see
// docs/observability.md: the claim middleware's own OnOutcome fires once
// per pass, which in-process retries repeat).
func (m *Metrics) OnOutcome(r middleware.Result) { m.m.OnOutcome(r) }

// OnRetry records one retried transient failure; use it as
// middleware.Claim.OnRetry.
func (m *Metrics) OnRetry(r middleware.TxRetry) { m.m.OnRetry(r) }
