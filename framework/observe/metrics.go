package observe

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/claimtx/claimtx/framework/internal/metrics"
	"github.com/claimtx/claimtx/middleware"
)

// Metrics records claimtx's outcomes in Prometheus:
//
//	m, err := observe.NewMetrics(prometheus.DefaultRegisterer)
//	claim.OnOutcome, claim.OnRetry = m.OnOutcome, m.OnRetry
type Metrics struct{ m *metrics.Metrics }

// NewMetrics registers claimtx's collectors on reg (once per registerer).
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m, err := metrics.New(reg)
	if err != nil {
		return nil, err
	}
	return &Metrics{m}, nil
}

// InitConsumer creates the series of one consumer and Watermill handler at
// zero, so dashboards and rate() see them before the first event.
func (m *Metrics) InitConsumer(consumer, handler string) { m.m.InitConsumer(consumer, handler) }

// OnOutcome records one Result; call it once per settled message.
func (m *Metrics) OnOutcome(r middleware.Result) { m.m.OnOutcome(r) }

// OnRetry records one retried transient failure; use it as
// middleware.Claim.OnRetry.
func (m *Metrics) OnRetry(r middleware.TxRetry) { m.m.OnRetry(r) }
