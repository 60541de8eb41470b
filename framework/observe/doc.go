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
// spans carry a hash of the key instead (claimtx.key_hash, the hex of the
// first 8 bytes of its SHA-256).
//
// docs/observability.md lists the metrics and span attributes, describes
// what healthy and unhealthy look like, and the Grafana dashboard in
// docs/grafana-dashboard.json.
package observe
