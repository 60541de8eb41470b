// Package chaos is a test harness, not a library: TestChaos (build tag
// chaos) runs the loyalty example as separate processes under sustained
// trouble (SIGKILLs, rolling restarts, a Postgres restart, lost broker
// connections, duplicate and undecodable messages) and checks that every
// order was still credited exactly once. README.md beside this file says
// what a run does, its flags (-pgbouncer, and the opt-in -pg-restart and
// -amqp-disrupt that act on shared servers) and its summary line:
//
//	make chaos      # 20,000 orders, >= 15 SIGKILLs and >= 15 SIGTERMs per broker
//	make chaos-ci   # 2,000 orders, >= 3 of each
//
// Everything is in _test.go files: the harness ships in no binary.
package chaos
