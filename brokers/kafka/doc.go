// Package kafka is claimtx's Kafka adapter: watermill-kafka v3.1.2 on Sarama
// v1.61, configured for consumer groups, at-least-once delivery and plain
// (non-Watermill) producers.
//
//	sub, err := kafka.NewSubscriber(ctx, kafka.Config{Brokers: []string{"kafka:9092"}, ConsumerGroup: "billing"}, logger)
//	msgs, err := sub.Subscribe(ctx, "orders")
//
// Most users build it through brokers.NewSubscriber with kind "kafka".
// Every Config field documents its default; an invalid Config is a
// *framework.ConfigError naming the field by its YAML key ("brokers",
// "sasl.mechanism").
// watermill-kafka must be v3.1.2 (go get ...@v3.1.2; "@latest" on the
// module proxy resolves to the older v3.0.6, which this package is not
// verified with).
//
// # Delivery
//
// Every Subscribe joins Config.ConsumerGroup (required, no default: two
// services sharing a group would split the topic). Within a partition one message
// is in flight at a time (unless Config.Window is set, see Window mode);
// partitions are consumed in parallel, so a consumer's concurrency is the
// number of partitions it owns. Ordering holds per partition: publish with
// a "partition_key" metadata entry (PartitionKeyMetadata) to keep one
// entity's messages in order.
//
// An ack marks the offset; marked offsets are committed every
// Config.CommitInterval (and when the group session ends). After a crash,
// up to one commit interval of acked messages is delivered again; the claim
// turns those into recorded duplicates. A group with no committed offset for
// a partition starts at Config.InitialOffset, "oldest" by default, so a new
// consumer group sees everything still retained.
//
// A nack cannot requeue one message in Kafka: watermill-kafka re-sends the
// same message from memory after Config.NackDelay, forever
// (subscriber.go:634), and its partition makes no progress meanwhile. The
// router's Retry and Poison middleware bound that loop; NackDelay keeps it
// from spinning.
//
// On a rebalance, the old owner of a partition may still be processing its
// last message while the new owner starts on the same one: the claim's row
// lock serialises them, and the loser records a duplicate.
//
// # Window mode
//
// One message per partition caps a batch consumer (consumer.NewBatch) at the
// number of partitions it owns. With Config.Window > 0, Subscribe runs its
// own Sarama consumer-group handler instead of watermill-kafka's, with the
// same Sarama configuration, start-up retry and record conversion (so
// metadata is identical), and forwards up to Window messages per partition
// before any is acked. Messages of a partition are handed out in order and may be acked in
// any order: an ack marks an offset only once every earlier message of the
// partition is acked, so the committed offset never passes an unacked
// message, and a long-unacked message holds the commit back (a restart
// redelivers everything after it; the claim makes that harmless). A nack
// re-sends a fresh copy (same UUID, payload and metadata) after NackDelay;
// its window slot stays taken, later messages go on. On a rebalance, ctx end
// or Close, the handler returns at once instead of waiting for outstanding
// acks: acks that come later are not marked (the partition may belong to
// another member by then), and those messages are delivered again from the
// committed offset. A message's context is cancelled once it is acked (or
// the subscription ends), not when its session ends, so work in progress may
// finish. watermill-kafka's context helpers (MessagePartitionFromCtx and the
// like) are not set in this mode; use the kafka_* metadata.
//
// # Plain producers and metadata
//
// The adapter consumes any record. Every header becomes the metadata entry
// of the same name (bytes as a string; of repeated keys the last wins); the
// UUID is the "_watermill_message_uuid" header when present and generated
// otherwise, so a franz-go or Java producer that only sets an event_id
// header is consumed normally. watermill-kafka treats an unmarshal error as
// fatal for the group session (subscriber.go:577) and would read the same
// record again after the rebalance, so converting a record never fails.
//
// The adapter adds where and when the record was stored, always overwriting
// headers of the same names, because a retention rule must be able to
// trust them. Key and event-time specs read them by name
// ("metadata:kafka_key"):
//
//	kafka_topic      the topic the record was read from
//	kafka_partition  its partition, decimal
//	kafka_offset     its offset, decimal
//	kafka_key        its key as a string; absent for a nil key
//	kafka_timestamp  the record timestamp, RFC 3339 with nanoseconds, UTC; absent if the record has none
//
// The timestamp is the producer's create time (or the broker's append time
// for LogAppendTime topics) and is the same on every redelivery of the
// record, which is what an event-time retention rule needs (the
// "kafka:timestamp" event-time spec reads it). None of these is a good
// claim key (an offset changes when a message is republished).
//
// Publishing sends every metadata entry as a header except the kafka_*
// ones, so copying a consumed message's metadata into a new message does
// not carry stale positions along; it adds the UUID header and uses the
// "partition_key" entry, if any, as the record key. A kafka_timestamp
// entry becomes the record timestamp (rounded down to the millisecond,
// Kafka's unit), so that an event time read from it survives a republish
// through this adapter (a poison copy, a relayed or replayed message);
// without one, or with a value that is not such a time, the producer
// stamps the time of the publish. A topic configured with LogAppendTime
// replaces it with the broker's time anyway, and Config.Version below 0.10
// sends no timestamp at all. Mind that the destination's time-based
// retention then counts from the original time (an old poison copy may be
// deleted sooner than a fresh one would), and that a cluster with
// message.timestamp.before.max.ms (message.timestamp.difference.max.ms
// before Kafka 3.6) set rejects copies older than that limit.
//
// # Sarama settings
//
// Config maps onto Sarama as follows: Version (default 3.6.0, verified
// against kfake), Consumer.Offsets.Initial from InitialOffset,
// Consumer.MaxWaitTime 100ms (Sarama's 500ms fetch wait is also how long
// Close and a commit can sit behind an open fetch, especially against
// kfake), the group session, heartbeat and rebalance timeouts, auto-commit
// every CommitInterval, and a sync producer with acks=all, up to 10 retries
// and idempotence (Kafka 0.11+), so a retried produce is not written twice.
//
// TLS and SASL are passed through: TLS with optional CA and client
// certificate files; SASL PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512 (Sarama has
// no SCRAM client of its own; this package adapts franz-go's). The SASL
// password is redacted whenever a Config is printed.
//
// # Start-up
//
// NewPublisher retries while no broker is reachable, and so does the first
// connection of each Subscribe, until Config.DialTimeout passes or the
// context (NewPublisher's, or Subscribe's) ends; after that,
// watermill-kafka re-creates a failed consumer by itself every
// ReconnectBackoff. NewSubscriber does not connect at all.
//
// # Development broker
//
// internal/devbroker runs a Kafka-protocol broker in process (kfake),
// for tests, demos and CI without a Kafka installation;
// framework/cmd/devkafka runs it as a program. Use short group timeouts
// against it in tests (SessionTimeout 1-3s, RebalanceTimeout a few seconds):
// Sarama's defaults make a rebalance wait up to 10s + 60s.
package kafka
