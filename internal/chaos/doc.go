// Package chaos is a test harness, not a library: TestChaos (build tag
// chaos) runs the loyalty example under sustained trouble and checks
// that every order was still credited exactly once. For RabbitMQ, for
// Kafka (the dev broker, framework/cmd/devkafka, run as a subprocess with a
// data directory, or with -kafka-broker kfake a plain kfake cluster in this
// process) and, with -brokers ...,nats, for NATS JetStream (the local
// server, reached through a TCP proxy of the runner's) it:
//
//   - publishes -orders OrderCompleted events, ~30% of them delivered 1-3
//     extra times (half of those copies with a fresh broker message id,
//     a quarter right behind their original), plus -bad undecodable ones,
//     spread over the chaos phase;
//   - creates a fresh database per broker (dropped afterwards unless
//     -keep) and starts all -consumers loyalty processes at once on it, so
//     they race each other through the start-up DDL as replicas of a new
//     deployment do;
//   - every 1-3 s either SIGKILLs a random consumer and restarts it at
//     once (at least -kills times), or gives one a rolling restart (at
//     least -terms times): SIGTERM once it consumes, wait for it to exit
//     by itself, start a replacement;
//   - on Kafka (-join-brokers) also SIGTERMs consumers that are still
//     joining the group: a consumer restarted a moment ago (by a SIGKILL
//     or a SIGTERM) gets SIGTERM as soon as it logs or up to 3 s after it
//     began consuming (at least -start-terms times), and a SIGKILL is
//     followed 1-2 s later by a SIGTERM of another consumer, a rolling
//     deploy that meets a crash (at least -kill-terms times);
//   - counts a hung shutdown whenever a SIGTERMed consumer is still
//     running -term-timeout later (default: the consumers' drain timeout,
//     DRAIN_TIMEOUT or 15s, plus -term-grace, 5s), and SIGKILLs it;
//   - restarts Postgres once (-pg-restart) after a third of these steps:
//     a private cluster the run started (testenv.StartPGCluster), which
//     the consumers' DATABASE_URL names;
//   - after two thirds, closes the run's RabbitMQ connections (by
//     connection name, rabbitmqctl close_connection), stops and restarts
//     the Kafka broker on the same address and data directory, or cuts
//     every consumer's NATS connection at the proxy (the shared servers
//     and their other clients are left alone);
//   - restarts, like a supervisor, any consumer that exits by itself, and
//     counts it as a crash, as it does an exit other than 0 after SIGTERM;
//   - waits for the drain, stops the consumers gracefully and checks: one
//     ledger row per order, the sum of balances as expected, nothing lost,
//     nothing doubled, nothing left in the queue / uncommitted in the group,
//     every bad message and nothing else in the poison destination (a
//     valid order there is wrongly poisoned), no crash, no hung shutdown.
//
// The Kafka consumers run with the example's default session and
// rebalance timeouts, the ones a user runs; -kafka-session-timeout and
// -kafka-rebalance-timeout shorten them explicitly (KAFKA_SESSION_TIMEOUT
// and KAFKA_REBALANCE_TIMEOUT in the runner's environment are not passed
// on). The consumers run per message, or in batches when BATCH_SIZE (and
// BATCH_WORKERS) are set in the environment: it is passed through.
// RabbitMQ's queues are classic, or quorum queues with -amqp-queue-type
// quorum (or AMQP_QUEUE_TYPE=quorum in the environment), which the
// consumers are given as AMQP_QUEUE_TYPE.
//
// It prints one summary line per broker and fails if any check fails.
// The knobs above are test flags, given after -args; relative paths
// (-loyalty, -devkafka, -logs) are taken from the module root, as make
// runs it:
//
//	make chaos      # 20,000 orders, >= 15 SIGKILLs and >= 15 SIGTERMs per broker, on Kafka >= 10 and 10 SIGTERMs of joining consumers
//	make chaos-ci   # 2,000 orders, >= 3 of each
//	go test -tags chaos -v -count=1 -timeout 0 -run '^TestChaos$' ./internal/chaos/ \
//	    -args -loyalty bin/loyalty -devkafka bin/devkafka -orders 20000 -kills 15 -terms 15
//
// -pgbouncer (make chaos-pgbouncer) runs the consumers through a
// PgBouncer of the run's own in transaction mode in front of the run's
// Postgres, DATABASE_URL with default_query_exec_mode=exec;
// TestChaosPgBouncerDisruptive is chaos-ci that way.
//
// TestChaosDisruptive (build tag disruptive) is make chaos-ci as a test,
// run by make test-disruptive. Everything is in _test.go files: the
// harness ships in no binary and no importable package.
//
// Acting on the shared servers is opt-in: -pg-restart "CMD" runs on the
// DATABASE_URL server and restarts it with CMD, -amqp-disrupt all closes
// every RabbitMQ connection on the host; never run those beside other
// work.
package chaos
