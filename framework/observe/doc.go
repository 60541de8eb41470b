// Package observe makes claimtx visible: Prometheus metrics, OpenTelemetry
// spans around each claim transaction, and a readiness check.
//
// The duplicate counter is the one to watch: its rate over all messages is
// the real redelivery rate of your broker and consumer setup, the number to
// show the next time someone proposes removing deduplication "because
// duplicates never happen".
//
// Everything here hangs off the claim middleware's hooks and plain
// Watermill middleware, so it fits any router. Labels never hold message
// keys (unbounded, possibly sensitive); spans carry a hash instead.
// docs/observability.md lists the metrics and span attributes.
package observe
