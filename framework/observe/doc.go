// Package observe makes claimtx visible: Prometheus metrics of outcomes,
// retries, claim wait and transaction time; OpenTelemetry spans around each
// claim transaction that continue the producer's trace; and a readiness
// check usable as an HTTP handler.
//
// The duplicate counter is the one to watch: its rate over all messages is
// the real redelivery rate of your broker and consumer setup, the number to
// show the next time someone proposes removing deduplication "because
// duplicates never happen".
//
// Everything here hangs off the claim middleware's hooks (OnOutcome,
// OnRetry) and plain Watermill middleware, so it can be added to any
// router; framework/consumer wires it when its Config asks for it. Labels
// never include message keys (unbounded cardinality, possibly sensitive);
// spans carry a hash of the key instead.
//
// # Metrics
//
// NewMetrics registers, all prefixed "claimtx_" (as are Watermill's router
// metrics when framework/consumer registers them, e.g.
// claimtx_handler_execution_time_seconds):
//
//	claimtx_messages_total              counter    consumer, handler, outcome
//	claimtx_fingerprint_mismatch_total  counter    consumer, handler
//	claimtx_retries_total               counter    consumer, cause
//	claimtx_claim_wait_seconds          histogram  consumer
//	claimtx_transaction_seconds         histogram  consumer, outcome
//	claimtx_poison_memo_errors_total    counter    consumer
//	claimtx_poison_refused_total        counter    consumer, fallback
//	claimtx_kafka_positions_skipped_total  counter  consumer, topic, partition
//	claimtx_kafka_position              gauge      consumer, topic, partition
//
// # Span attributes
//
// Tracing.OnOutcome sets claimtx.consumer, claimtx.outcome,
// claimtx.attempts and claimtx.key_hash (the hex of the first 8 bytes of
// the key's SHA-256, never the key).
//
// docs/observability.md describes the metrics, what healthy and unhealthy
// look like, and the Grafana dashboard in docs/grafana-dashboard.json.
package observe
