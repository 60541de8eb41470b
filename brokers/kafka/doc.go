// Package kafka is claimtx's Kafka adapter: watermill-kafka v3.1.2 on Sarama
// v1.61, configured for consumer groups, at-least-once delivery and plain
// (non-Watermill) producers.
//
//	sub, err := kafka.NewSubscriber(kafka.Config{Brokers: []string{"kafka:9092"}, ConsumerGroup: "billing"}, logger)
//	msgs, err := sub.Subscribe(ctx, "orders")
//
// Most users build it through brokers.NewSubscriber with kind "kafka".
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
// a partition_key metadata entry (see PartitionKeyMetadata) to keep one
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
// same Sarama configuration, start-up retry and Marshaler (so metadata is
// identical), and forwards up to Window messages per partition before any is
// acked. Messages of a partition are handed out in order and may be acked in
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
// The Marshaler consumes any record. Headers become metadata (bytes as
// strings); the UUID is Watermill's header when present and generated
// otherwise, so a franz-go or Java producer that only sets an event_id header
// is consumed normally. watermill-kafka treats an unmarshal error as fatal
// for the group session (subscriber.go:577) and would read the same record
// again after the rebalance, so Unmarshal never fails.
//
// The adapter adds where and when the record was stored, always overwriting
// headers of the same names: kafka_topic, kafka_partition, kafka_offset,
// kafka_key (absent for a nil key) and kafka_timestamp, the record timestamp
// in RFC 3339 with nanoseconds, UTC (absent if the record has none). The
// timestamp is the producer's create time (or the broker's append time for
// LogAppendTime topics) and is the same on every redelivery of the record,
// which is what an event-time retention rule needs. None of these is a good
// claim key (an offset changes when a message is republished), and Marshal
// never publishes kafka_* keys, so copying a consumed message's metadata
// into a new message does not carry stale positions along.
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
// Config.SaramaConfig returns the result for tools that need it.
//
// TLS and SASL are passed through: TLS with optional CA and client
// certificate files; SASL PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512 (Sarama has
// no SCRAM client of its own; this package adapts franz-go's). The SASL
// password is redacted whenever a Config is printed.
//
// # Start-up
//
// NewPublisherContext retries while no broker is reachable, and so does the
// first connection of each Subscribe, until Config.DialTimeout or the
// context ends; after that, watermill-kafka re-creates a failed consumer by
// itself every ReconnectBackoff. NewSubscriber does not connect at all.
//
// # Development broker
//
// internal/devbroker runs a Kafka-protocol broker in process (kfake),
// for tests, demos and CI without a Kafka installation;
// framework/cmd/devkafka runs it as a program. Use short group timeouts
// against it in tests (SessionTimeout 1-3s, RebalanceTimeout a few seconds):
// Sarama's defaults make a rebalance wait up to 10s + 60s.
package kafka
