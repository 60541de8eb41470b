// Package kafkatest runs a single-node Kafka-protocol broker inside the
// current process, built on franz-go's kfake, so a Kafka consumer can be
// tested (or demonstrated, or run in CI) without a Kafka server, as
// net/http/httptest serves HTTP without one. It is not a production broker:
// one node, no replication, no quotas, data in memory unless a data
// directory is given.
//
//	b, err := kafkatest.Start(ctx, kafkatest.Options{})
//	if err != nil { ... }
//	defer b.Close()
//	cfg := brokers.KafkaConfig{Brokers: b.Addrs(), SessionTimeout: 2 * time.Second}
//
// framework/cmd/devkafka runs it as a program.
//
// # What it sets up
//
// Topics are created on first use (metadata or produce) with
// Options.Partitions partitions, like a development Kafka with
// auto.create.topics.enable. The broker listens on Options.Addr (a free
// port of 127.0.0.1 unless set) exactly and
// advertises that address in its metadata, so the host must be one clients
// can reach (kfake itself always binds 127.0.0.1; Start overrides that).
// Options.GroupMinSessionTimeout defaults to 100ms instead of Kafka's 6s so
// tests can use short session timeouts and fail over quickly.
//
// With Options.DataDir, kfake persists topics, records, committed offsets
// and group state to that directory and reloads them on the next Start with
// the same directory; Close saves the final state. Without it everything is
// lost on Close.
//
// # Silent members
//
// kfake does not always expire a consumer-group member that dies while its
// JoinGroup waits for a rebalance. It starts a member's session timer when
// it writes the JoinGroup reply (groups.go, group.reply) and not when the
// reply cannot be written; whether a dead connection counts as "cannot" is a
// coin flip, because clientReq.reply (client_conn.go:74) selects between a
// buffered response channel and the connection's closed done channel. In the
// losing half the dead member stays in the group for good, and after the
// leader's assignment it owns partitions nobody consumes. A real broker
// expires it after its session timeout. Kill tests and demos that SIGKILL a
// consumer during a rebalance stall on exactly this.
//
// The broker therefore watches classic group traffic: control functions
// (Cluster.ControlKey, observing only, never handling a request) record
// each member's last JoinGroup, SyncGroup, Heartbeat or OffsetCommit and the
// session timeout it joined with; every 250ms it
// reads each group (Cluster.GroupInfo) and sends a LeaveGroup on behalf of a
// member that has been silent longer than its session timeout plus a
// second, the request the member would have sent on a clean
// shutdown. kfake then rebalances and the live members take over. Each
// eviction is logged at Info. The group
// state is taken into account, as a real broker's heartbeat deadlines do:
// while a group is PreparingRebalance, a member whose JoinGroup is waiting
// is never evicted (it legitimately waits without heartbeating), but one
// that has not rejoined is, once silent past its session timeout plus the
// margin. kfake's own rebalance timer would not end such a rebalance: it
// waits for the longest rebalance timeout and restarts at every join, so a
// group that members keep joining (a rolling restart, a crash loop) never
// finishes it, and collects dead members. Every member's clock restarts
// when a rebalance completes, because its JoinGroup may have been parked
// for a long time. KIP-848 groups
// (ConsumerGroupHeartbeat) are left alone: kfake times those out itself.
// Options.DisableEviction turns all of this off.
//
// # Limits
//
//   - kfake keeps, per control function, a map entry for every client
//     connection it has seen (cluster.go:949) and never prunes it, so a
//     broker that serves millions of short connections grows slowly. Restart
//     long-running dev brokers now and then.
//   - Control functions run on kfake's single request loop; the observers
//     only record a timestamp, but every group request passes through them.
//   - kfake's GroupInfo blocks forever once the cluster is closed
//     (cluster.go:1299): Close stops the eviction loop first.
//   - A LeaveGroup from a member whose JoinGroup is waiting removes it, but
//     kfake never answers that JoinGroup (a real broker answers it with
//     UNKNOWN_MEMBER_ID), so such a client waits for its request timeout.
//     brokers/kafka sends that LeaveGroup itself and does not wait.
package kafkatest
