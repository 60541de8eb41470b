// Package kafka is claimtx's Kafka adapter: a consumer-group subscriber on
// franz-go (kgo) and a publisher on watermill-kafka v3.1.2 and Sarama v1.61,
// configured for at-least-once delivery and plain (non-Watermill)
// producers. Both speak watermill-kafka's record format.
//
//	sub, err := kafka.NewSubscriber(ctx, brokers.KafkaConfig{Brokers: []string{"kafka:9092"}, ConsumerGroup: "billing"}, logger)
//	msgs, err := sub.Subscribe(ctx, "orders")
//
// Most users import it for its side effect, which registers the kind
// "kafka", and build it through brokers.NewSubscriber. Every
// brokers.KafkaConfig field documents its default; an invalid one is a
// *framework.ConfigError naming the field by its YAML key. watermill-kafka
// must be v3.1.2: "@latest" on the module proxy resolves to the older
// v3.0.6, which this package is not verified with.
//
// # Delivery
//
// Every Subscribe joins ConsumerGroup (required: two services sharing a
// group would split the topic). Within a partition one message is in
// flight, or up to Window; partitions are consumed in parallel. Order holds
// per partition: publish with a "partition_key" entry (PartitionKeyMetadata)
// to keep one entity's messages in order. An ack marks the partition's
// offset once every earlier message is acked, so the committed offset never
// passes an unacked message; marks are committed every CommitInterval, on
// revoke and when the subscription ends. After a crash up to one commit
// interval is delivered again: duplicates for the claims, skipped when the
// consumer stores positions with them (framework/consumer does). A nack
// re-sends a fresh copy (same UUID, payload and metadata) after NackDelay;
// the nacked message keeps its window slot, and the router's Retry and
// Poison bound the loop.
//
// Each message's context carries its record's topic, partition and offset
// (internal/kafkarecord), from which the claim transaction stores the
// partition's settled position; watermill-kafka's context helpers are not
// set: use the kafka_* metadata.
//
// # Rebalances and shutdown
//
// Revoked partitions stop at once (work in progress is not cancelled),
// their acked offsets are committed and their unacked messages go to the
// next owner. Ending a subscription commits, leaves the group and closes
// the channel within 5 s; Close returns within 6 s. Details (eager range
// protocol, group request timeouts) in docs/design.md, "Kafka consumer group".
//
// # Plain producers and metadata
//
// Any record is consumed: every header becomes metadata of the same name
// (of repeated keys the last wins), the UUID is the "_watermill_message_uuid"
// header or a new one, and converting never fails (watermill-kafka treats an
// unmarshal error as fatal for the session and would read the record again
// forever). The kafka_* delivery metadata (docs/configuration.md, "Delivery
// metadata") overwrites headers of those names, so retention rules can
// trust them. Publishing sends every other entry as a header, uses
// "partition_key" as the record key, and makes a kafka_timestamp entry the
// record timestamp, so a poison, relayed or replayed copy keeps its event
// time; the destination's time-based retention then counts from that time,
// and message.timestamp.before.max.ms rejects copies older than it.
//
// # Client settings and start-up
//
// The subscriber negotiates protocol versions, so Version (default 3.6.0)
// applies to the publisher only: a Sarama sync producer with acks=all, up to
// 10 retries and idempotence (Kafka 0.11+). TLS and SASL (PLAIN,
// SCRAM-SHA-256/512) apply to both. NewPublisher, and the first contact of
// each Subscribe, retry until DialTimeout or their context ends; refused
// credentials fail at once. brokers/kafka/kafkatest runs a Kafka-protocol
// broker in process for tests, demos and CI.
package kafka
