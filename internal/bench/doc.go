// Package bench measures what claimtx costs, side by side in one run, for
// RabbitMQ and Kafka at several concurrencies: (a) a raw pgx loop, no
// broker; (b) a Watermill router, no claim; (c) with the claim middleware;
// (n) the claim in ModeNaturalKey; (d) batches (consumer.NewBatch); (h)
// (c)'s guarantee written by hand on the broker's own client. It prints
// msgs/s, p50 and p99 and their ratios; docs/benchmarks.md describes each
// mode and holds the figures (-write rewrites it). -storm measures a
// duplicate storm instead, -memory the consumer's memory.
//
// It is a measuring tool, not a test of behaviour: its files are tests
// behind the build tag bench, its options test flags given after -args,
// and TestBench runs from the module root (-write and -cpuprofile paths
// are relative to it):
//
//	make bench          # BENCH_N, writes docs/benchmarks.md
//	make bench-storm    # STORM_N
//	make bench-memory   # MEMORY_N
//	go test -tags bench -run '^TestBench$' -count=1 -timeout 0 -v ./internal/bench/ \
//		-args -n 3000 -concurrency 1,4,16 -brokers amqp,kafka
//
// DATABASE_URL and AMQP_URL name the servers (the local defaults
// otherwise); Kafka is an in-process kfake broker.
package bench
