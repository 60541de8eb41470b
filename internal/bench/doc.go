// Package bench measures what claimtx costs, side by side in one run, for
// RabbitMQ and Kafka at several concurrencies, against a raw pgx loop, a
// Watermill router without the claim and the same guarantee written by
// hand; docs/benchmarks.md describes each mode and holds the figures. It is
// a measuring tool: its files are tests behind the build tag bench, run
// from the module root with their options after -args:
//
//	make bench          # BENCH_N, writes docs/benchmarks.md
//	make bench-storm    # STORM_N
//	make bench-memory   # MEMORY_N
package bench
