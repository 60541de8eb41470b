// Package metrics is the Prometheus side of framework/observe.Metrics,
// with the hooks only framework/consumer calls.
package metrics

import (
	"cmp"
	"fmt"
	"strconv"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/internal/pg"
	"github.com/claimtx/claimtx/middleware"
)

// Metric names, listed in docs/observability.md; the dashboard test checks
// docs/grafana-dashboard.json against them.
const (
	metricMessages            = namespace + "_messages_total"
	metricFingerprintMismatch = namespace + "_fingerprint_mismatch_total"
	metricRetries             = namespace + "_retries_total"
	metricClaimWait           = namespace + "_claim_wait_seconds"
	metricTransaction         = namespace + "_transaction_seconds"
	metricPoisonMemoErrors    = namespace + "_poison_memo_errors_total"
	metricPoisonRefused       = namespace + "_poison_refused_total"
	metricPositionsSkipped    = namespace + "_kafka_positions_skipped_total"
	metricPosition            = namespace + "_kafka_position"
	metricParkedKeys          = namespace + "_parked_keys"
	metricParkedMessages      = namespace + "_parked_messages"
	metricParkedOldest        = namespace + "_parked_oldest_seconds"
	metricUnordered           = namespace + "_unordered_total"
)

const (
	namespace         = "claimtx" // Watermill's router metrics have it too
	retryCauseHandler = "handler" // the others are middleware.TxRetry.Cause's
)

// The label values InitConsumer creates ahead of their first event.
var (
	outcomes = []framework.Outcome{framework.Applied, framework.Duplicate, framework.Failed, framework.Poisoned, framework.Expired, framework.Parked}
	// Only transient causes are retried (store.IsTransient).
	retryCauses = []string{
		pg.Serialization.String(), pg.Deadlock.String(),
		pg.ClaimWait.String(), pg.Connection.String(), retryCauseHandler,
	}
	// middleware.PoisonRefusal.Fallback's; "none": nacked.
	fallbacks = []string{"smaller_copy", "dead_letter_table", "none"}
)

// Metrics records claimtx's outcomes in Prometheus; labels never hold the
// key, whose cardinality is unbounded.
type Metrics struct {
	messages    *prometheus.CounterVec
	mismatch    *prometheus.CounterVec
	retries     *prometheus.CounterVec
	claimWait   *prometheus.HistogramVec
	transaction *prometheus.HistogramVec
	memoErrors  *prometheus.CounterVec
	refused     *prometheus.CounterVec
	skipped     *prometheus.CounterVec
	position    *prometheus.GaugeVec
	parked      *prometheus.GaugeVec // keys, messages, oldest: by metric
	parkedMsgs  *prometheus.GaugeVec
	parkedAge   *prometheus.GaugeVec
	unordered   *prometheus.CounterVec
}

// New registers claimtx's collectors on reg.
func New(reg prometheus.Registerer) (*Metrics, error) {
	if reg == nil {
		return nil, &framework.ConfigError{Field: "Registerer", Reason: "must not be nil"}
	}
	// Claim waits are usually sub-millisecond; a wait behind a twin lasts
	// as long as the twin's transaction, up to the claim wait (5 s).
	waitBuckets := []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5}
	counter := func(name, help string, labels ...string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels)
	}
	gauge := func(name, help string, labels ...string) *prometheus.GaugeVec {
		return prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help}, labels)
	}
	histogram := func(name, help string, buckets []float64, labels ...string) *prometheus.HistogramVec {
		return prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets}, labels)
	}
	m := &Metrics{
		messages: counter(metricMessages,
			"Messages settled (acked or nacked), one final outcome each: applied, duplicate, failed (nacked), poisoned or expired (dead-lettered).",
			"consumer", "handler", "outcome"),
		mismatch: counter(metricFingerprintMismatch,
			"Duplicates whose payload fingerprint differs from the original's: a producer or key-derivation bug.",
			"consumer", "handler"),
		retries: counter(metricRetries,
			"Retries by cause: transient failures of the claim transaction (serialization, deadlock, claim_wait, connection) and in-process retries of failed handlers (handler).",
			"consumer", "cause"),
		claimWait: histogram(metricClaimWait,
			"Time BEGIN and the claim statement took (one round trip), including any wait for a pool connection or behind an uncommitted twin.",
			waitBuckets, "consumer"),
		transaction: histogram(metricTransaction,
			"Time from key derivation to commit or rollback, retries included.",
			prometheus.DefBuckets, "consumer", "outcome"),
		memoErrors: counter(metricPoisonMemoErrors,
			"Poisoned messages whose poison memo could not be recorded (the copy is in the poison destination; the next delivery runs the handler again).",
			"consumer"),
		refused: counter(metricPoisonRefused,
			"Poisoned copies the broker refused for good (too large, not allowed, no such destination), by where the message went instead: smaller_copy (a copy with a shorter reason was published), dead_letter_table (recorded in Postgres, original acked) or none (nacked; it comes back).",
			"consumer", "fallback"),
		skipped: counter(metricPositionsSkipped,
			"Kafka partitions started at the position stored with the claims because the group's offset was below it (a crash before the offset commit, a group reset or deletion, a rewind): the records in between were skipped as settled.",
			"consumer", "topic", "partition"),
		position: gauge(metricPosition,
			"Kafka position stored with the claims: the offset below which every record of the partition is settled (applied, duplicate or poisoned).",
			"consumer", "topic", "partition"),
		parked: gauge(metricParkedKeys,
			"Order keys parked (middleware.Claim.OrderKey): a message of each failed for good, and it and its later messages wait for a release.",
			"consumer"),
		parkedMsgs: gauge(metricParkedMessages,
			"Messages parked, in all parked order keys.",
			"consumer"),
		parkedAge: gauge(metricParkedOldest,
			"Age of the oldest parked order key (0 when none is parked).",
			"consumer"),
		unordered: counter(metricUnordered,
			"Messages whose order key could not be derived (a missing field, a key the key policy refuses): applied without order, each logged.",
			"consumer"),
	}
	for _, c := range []prometheus.Collector{m.messages, m.mismatch, m.retries, m.claimWait, m.transaction, m.memoErrors, m.refused, m.skipped, m.position, m.parked, m.parkedMsgs, m.parkedAge, m.unordered} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("claimtx: register metrics: %w", err)
		}
	}
	return m, nil
}

// InitConsumer creates one consumer's series at zero; handler "" in batch
// mode.
func (m *Metrics) InitConsumer(consumer, handler string) {
	for _, o := range outcomes {
		m.messages.WithLabelValues(consumer, handler, string(o))
	}
	for _, o := range []framework.Outcome{framework.Applied, framework.Duplicate, framework.Failed} {
		m.transaction.WithLabelValues(consumer, string(o))
	}
	for _, c := range retryCauses {
		m.retries.WithLabelValues(consumer, c)
	}
	m.mismatch.WithLabelValues(consumer, handler)
	m.claimWait.WithLabelValues(consumer)
	m.memoErrors.WithLabelValues(consumer)
	m.unordered.WithLabelValues(consumer)
	for _, f := range fallbacks {
		m.refused.WithLabelValues(consumer, f)
	}
}

// OnOutcome records one Result; call it once per settled message.
func (m *Metrics) OnOutcome(r middleware.Result) {
	handler := ""
	if r.Message != nil {
		handler = message.HandlerNameFromCtx(r.Message.Context())
	}
	m.messages.WithLabelValues(r.Consumer, handler, string(r.Outcome)).Inc()
	if r.Outcome == framework.Applied || r.Outcome == framework.Duplicate || r.Outcome == framework.Failed {
		// Poisoned/expired results carry no timings of their own.
		if r.Attempts > 0 {
			m.claimWait.WithLabelValues(r.Consumer).Observe(r.ClaimWait.Seconds())
		}
		m.transaction.WithLabelValues(r.Consumer, string(r.Outcome)).Observe(r.Duration.Seconds())
	}
	if r.Outcome == framework.Duplicate && r.FingerprintMismatch {
		m.mismatch.WithLabelValues(r.Consumer, handler).Inc()
	}
	if r.Unordered {
		m.unordered.WithLabelValues(r.Consumer).Inc()
	}
}

// OnRetry records one retried transient failure (middleware.Claim.OnRetry).
func (m *Metrics) OnRetry(r middleware.TxRetry) {
	m.retries.WithLabelValues(r.Consumer, r.Cause).Inc()
}

// OnHandlerRetry records one in-process retry of a failed handler.
func (m *Metrics) OnHandlerRetry(consumer string) {
	m.retries.WithLabelValues(consumer, retryCauseHandler).Inc()
}

// OnPoisonMemoError records a poison memo that could not be written.
func (m *Metrics) OnPoisonMemoError(consumer string) {
	m.memoErrors.WithLabelValues(consumer).Inc()
}

// OnPoisonRefused records a poisoned copy the broker refused for good, by
// middleware.PoisonRefusal.Fallback.
func (m *Metrics) OnPoisonRefused(consumer, fallback string) {
	m.refused.WithLabelValues(consumer, cmp.Or(fallback, "none")).Inc()
}

// OnPositionSkipped records a Kafka partition started past its offset.
func (m *Metrics) OnPositionSkipped(consumer, topic string, partition int32) {
	m.skipped.WithLabelValues(consumer, topic, strconv.Itoa(int(partition))).Inc()
}

// SetPosition exports a stored Kafka position.
func (m *Metrics) SetPosition(consumer, topic string, partition int32, settledBelow int64) {
	m.position.WithLabelValues(consumer, topic, strconv.Itoa(int(partition))).Set(float64(settledBelow))
}

// SetParked exports one consumer's parked keys and messages, and the age
// of its oldest parked key.
func (m *Metrics) SetParked(consumer string, keys, messages int64, oldest time.Duration) {
	m.parked.WithLabelValues(consumer).Set(float64(keys))
	m.parkedMsgs.WithLabelValues(consumer).Set(float64(messages))
	m.parkedAge.WithLabelValues(consumer).Set(oldest.Seconds())
}

// Names lists every metric name New registers.
func Names() []string {
	return []string{metricMessages, metricFingerprintMismatch, metricRetries, metricClaimWait, metricTransaction, metricPoisonMemoErrors, metricPoisonRefused, metricPositionsSkipped, metricPosition,
		metricParkedKeys, metricParkedMessages, metricParkedOldest, metricUnordered}
}
