// Package chaos is a test harness, not a library: TestChaos (build tag
// chaos) runs the loyalty example as separate processes under sustained
// trouble (SIGKILLs, rolling restarts, SIGTERMs of joining Kafka members,
// a Postgres restart, lost broker connections, duplicate and undecodable
// messages) and checks that every order was still credited exactly once.
// README.md beside this file says what a run does, its flags (test flags,
// given after -args; relative paths from the module root, as make runs it)
// and what each counter of its summary line means:
//
//	make chaos      # 20,000 orders, >= 15 SIGKILLs and >= 15 SIGTERMs per broker
//	make chaos-ci   # 2,000 orders, >= 3 of each
//
// -pgbouncer (make chaos-pgbouncer) runs the consumers through a PgBouncer
// of the run's own in transaction mode in front of the run's Postgres,
// DATABASE_URL with default_query_exec_mode=exec;
// TestChaosPgBouncerDisruptive is chaos-ci that way. TestChaosDisruptive
// (build tag disruptive) is chaos-ci as a test, run by make
// test-disruptive. Everything is in _test.go files: the harness ships in
// no binary and no importable package.
//
// Acting on the shared servers is opt-in: -pg-restart "CMD" runs on the
// DATABASE_URL server and restarts it with CMD, -amqp-disrupt all closes
// every RabbitMQ connection on the host; never run those beside other
// work.
package chaos
