// Package bench measures what claimtx costs, side by side in one run, for
// RabbitMQ and Kafka at several concurrencies:
//
//	(a) raw:      a pgx loop doing claim + effect per message, no broker
//	(b) router:   the same effect through a Watermill router + broker, no claim
//	(c) claimtx:  the same through router + broker + the claim middleware
//	(n) natural:  (c) with the claim in ModeNaturalKey
//	(d) batch:    claim + a set-wise effect per batch (consumer.NewBatch)
//	(h) hand:     (c)'s claim + effect written by hand on the broker's own
//	              client (amqp091-go, franz-go), no Watermill, no claimtx
//
// and prints msgs/s, p50 and p99 of the per-message handling time, and the
// ratios between them. With -write it also writes docs/benchmarks.md.
// With -storm it measures a duplicate storm instead, with -memory the
// consumer's memory over many messages.
//
// It is a measuring tool, not a test of behaviour: its files are tests
// behind the build tag bench, so that go test ./... leaves it out, and its
// options are test flags, given after -args. TestBench runs from the
// module root, so -write and -cpuprofile paths are relative to it. -v
// makes go test stream the output as the run goes, and -timeout 0 lets a
// long run finish:
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
