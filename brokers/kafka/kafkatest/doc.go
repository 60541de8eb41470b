// Package kafkatest runs a single-node Kafka-protocol broker inside the
// current process, built on franz-go's kfake, as net/http/httptest serves
// HTTP: for tests, demos and CI without a Kafka server. It is not a
// production broker: one node, no replication, no quotas, data in memory
// unless Options.DataDir is set (then kfake saves its state there on Close
// and reloads it on the next Start).
//
//	b, err := kafkatest.Start(ctx, kafkatest.Options{})
//	if err != nil { ... }
//	defer b.Close()
//	cfg := brokers.KafkaConfig{Brokers: b.Addrs(), SessionTimeout: 2 * time.Second}
//
// framework/cmd/devkafka runs it as a program. Topics are created on first
// use, like a development Kafka with auto.create.topics.enable.
//
// # Silent members
//
// kfake gives a member that dies while its JoinGroup waits no session
// timer, and restarts its rebalance timer at every join, so a group under
// rolling restarts collects dead members that own partitions nobody
// consumes (docs/design.md, "Kafka consumer group"). The broker therefore
// watches classic group traffic and, every 250ms, sends a LeaveGroup for a
// member silent past its session timeout plus a second, logged at Info; a
// member whose JoinGroup waits during PreparingRebalance is never evicted,
// and KIP-848 groups are left alone. Options.DisableEviction turns it off.
//
// # Limits
//
//   - kfake keeps a map entry per client connection it has seen and never
//     prunes it: restart long-running dev brokers now and then.
//   - kfake's GroupInfo blocks forever once the cluster is closed, so Close
//     stops the eviction loop first.
//   - kfake never answers the JoinGroup of a member removed by LeaveGroup (a
//     real broker answers UNKNOWN_MEMBER_ID): such a client waits for its
//     request timeout. brokers/kafka sends that LeaveGroup itself and does
//     not wait.
package kafkatest
