package observe

import (
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/middleware"
)

// Metric names. They are exported so dashboards and alerts can be checked
// against what the library really registers (the dashboard test does).
const (
	MetricMessages            = "claimtx_messages_total"
	MetricFingerprintMismatch = "claimtx_fingerprint_mismatch_total"
	MetricRetries             = "claimtx_retries_total"
	MetricClaimWait           = "claimtx_claim_wait_seconds"
	MetricTransaction         = "claimtx_transaction_seconds"
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
// The redelivery rate of a consumer is
// rate(claimtx_messages_total{outcome="duplicate"}) / rate(claimtx_messages_total).
type Metrics struct {
	messages    *prometheus.CounterVec
	mismatch    *prometheus.CounterVec
	retries     *prometheus.CounterVec
	claimWait   *prometheus.HistogramVec
	transaction *prometheus.HistogramVec
}

// NewMetrics registers claimtx's collectors on reg. Registering twice on
// one registerer is an error (prometheus.AlreadyRegisteredError), as
// Prometheus requires.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	if reg == nil {
		return nil, &framework.ConfigError{Field: "Registerer", Reason: "must not be nil"}
	}
	// Claim waits are usually sub-millisecond; a wait behind a twin lasts
	// as long as the twin's transaction, up to the claim wait (5 s).
	waitBuckets := []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5}
	m := &Metrics{
		messages: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: MetricMessages,
			Help: "Messages handled by the claim middleware, by outcome (applied, duplicate, failed, poisoned, expired).",
		}, []string{"consumer", "handler", "outcome"}),
		mismatch: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: MetricFingerprintMismatch,
			Help: "Duplicates whose payload fingerprint differs from the original's: a producer or key-derivation bug.",
		}, []string{"consumer", "handler"}),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: MetricRetries,
			Help: "Transient failures of the claim transaction that were retried, by cause (serialization, deadlock, claim_wait, connection).",
		}, []string{"consumer", "cause"}),
		claimWait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    MetricClaimWait,
			Help:    "Time BEGIN and the claim statement took (one round trip), including any wait for a pool connection or behind an uncommitted twin.",
			Buckets: waitBuckets,
		}, []string{"consumer"}),
		transaction: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    MetricTransaction,
			Help:    "Time from key derivation to commit or rollback, retries included.",
			Buckets: prometheus.DefBuckets,
		}, []string{"consumer", "outcome"}),
	}
	for _, c := range []prometheus.Collector{m.messages, m.mismatch, m.retries, m.claimWait, m.transaction} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("claimtx: register metrics: %w", err)
		}
	}
	return m, nil
}

// OnOutcome records one Result; use it as middleware.Claim.OnOutcome (and
// for poisoned/expired results reported by the composition root).
func (m *Metrics) OnOutcome(r middleware.Result) {
	handler := ""
	if r.Message != nil {
		handler = message.HandlerNameFromCtx(r.Message.Context())
	}
	m.messages.WithLabelValues(r.Consumer, handler, string(r.Outcome)).Inc()
	if r.Outcome == framework.Applied || r.Outcome == framework.Duplicate || r.Outcome == framework.Failed {
		// Poisoned/expired results are reported outside the claim and
		// carry no timings of their own.
		if r.Attempts > 0 {
			m.claimWait.WithLabelValues(r.Consumer).Observe(r.ClaimWait.Seconds())
		}
		m.transaction.WithLabelValues(r.Consumer, string(r.Outcome)).Observe(r.Duration.Seconds())
	}
	if r.Outcome == framework.Duplicate && r.FingerprintMismatch {
		m.mismatch.WithLabelValues(r.Consumer, handler).Inc()
	}
}

// OnRetry records one retried transient failure; use it as
// middleware.Claim.OnRetry.
func (m *Metrics) OnRetry(r middleware.Retry) {
	m.retries.WithLabelValues(r.Consumer, r.Cause.String()).Inc()
}

// Names lists every metric name NewMetrics registers.
func Names() []string {
	return []string{MetricMessages, MetricFingerprintMismatch, MetricRetries, MetricClaimWait, MetricTransaction}
}
