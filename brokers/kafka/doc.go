// Package kafka is claimtx's Kafka adapter: a consumer-group subscriber on
// franz-go (kgo) and a publisher on watermill-kafka v3.1.2 and Sarama v1.61,
// configured for at-least-once delivery and plain (non-Watermill) producers.
// Both speak watermill-kafka's record format, so either side can read the
// other's messages.
//
//	sub, err := kafka.NewSubscriber(ctx, brokers.KafkaConfig{Brokers: []string{"kafka:9092"}, ConsumerGroup: "billing"}, logger)
//	msgs, err := sub.Subscribe(ctx, "orders")
//
// Most users import it for its side effect, which registers the kind
// "kafka", and build it through brokers.NewSubscriber.
// Every brokers.KafkaConfig field documents its default; an invalid brokers.KafkaConfig is a
// *framework.ConfigError naming the field by its YAML key ("brokers",
// "sasl.mechanism").
// watermill-kafka must be v3.1.2 (go get ...@v3.1.2; "@latest" on the
// module proxy resolves to the older v3.0.6, which this package is not
// verified with).
//
// # Delivery
//
// Every Subscribe joins brokers.KafkaConfig.ConsumerGroup (required, no default: two
// services sharing a group would split the topic). Within a partition one
// message is in flight at a time, or up to brokers.KafkaConfig.Window; partitions are
// consumed in parallel, so a consumer's concurrency is the number of
// partitions it owns times the window. Ordering holds per partition:
// publish with a "partition_key" metadata entry (PartitionKeyMetadata) to
// keep one entity's messages in order.
//
// An ack marks the partition's offset once every earlier message of the
// partition is acked, so the committed offset never passes an unacked
// message; marked offsets are committed every brokers.KafkaConfig.CommitInterval, when
// partitions are revoked and when the subscription ends. After a crash, up
// to one commit interval of acked messages is delivered again; the claim
// turns those into recorded duplicates, and a consumer that stores its
// positions with the claims (framework/consumer does on Kafka) starts past
// them. A group with no committed offset for a partition starts at
// brokers.KafkaConfig.InitialOffset, "oldest" by default, so a new consumer group sees
// everything still retained.
//
// A nack cannot requeue one message in Kafka: the subscriber re-sends a
// fresh copy (same UUID, payload and metadata) after brokers.KafkaConfig.NackDelay, and
// the nacked message keeps its window slot, so with the default window of
// one its partition waits for it. The router's Retry and Poison middleware
// bound that loop.
//
// # Rebalances and shutdown
//
// The group uses the eager range protocol (Sarama's default, so a group
// can be rolled from an older claimtx, whose subscriber was Sarama's, to
// this one). A rebalance does not wait for messages in flight: revoked
// partitions stop forwarding at once, their acked offsets are committed,
// and their unacked messages are delivered again to the next owner, where
// the claim's row lock serialises the two and the loser records a
// duplicate. Work in progress is not cancelled by a rebalance: a message's
// context ends once it is acked or the subscription ends.
//
// Every group request waits for the coordinator as long as the coordinator
// may legitimately hold it: a JoinGroup or SyncGroup answer up to
// brokers.KafkaConfig.RebalanceTimeout plus 10 s, as the Java client does. (Sarama's
// consumer group, used before, gave up after its 30 s read timeout
// whatever the rebalance timeout, rejoined and gave up again: under
// rolling restarts that met a crash, the group stopped consuming, and a
// member stuck in a join could not be stopped. That is why the subscriber
// is franz-go's.) No brokers.KafkaConfig field sets a request timeout, so none can undo
// this.
//
// Ending a subscription (its context, or Close) stops forwarding, commits
// the acked offsets, leaves the group (which cancels a join in flight) and
// closes the channel; the waits on the cluster share a 5 s bound, so a
// broker that does not answer cannot hold a shutdown: what was not
// committed is delivered again, and a member that could not leave is
// evicted after its session timeout. Close returns within 6 s.
//
// Each message's context carries where its record came from (topic,
// partition, offset), which framework/consumer uses to store the
// partition's settled position in the claim transaction; watermill-kafka's
// context helpers (MessagePartitionFromCtx and the like) are not set: use
// the kafka_* metadata.
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
// replaces it with the broker's time anyway, and brokers.KafkaConfig.Version below 0.10
// sends no timestamp at all. Mind that the destination's time-based
// retention then counts from the original time (an old poison copy may be
// deleted sooner than a fresh one would), and that a cluster with
// message.timestamp.before.max.ms (message.timestamp.difference.max.ms
// before Kafka 3.6) set rejects copies older than that limit.
//
// # Client settings
//
// The subscriber maps brokers.KafkaConfig onto franz-go: the group's session, heartbeat
// and rebalance timeouts, FetchMaxWait from MaxWaitTime (100 ms: a fetch
// that waits longer on the broker also delays the end of a subscription),
// the reset offset from InitialOffset, commits of marked offsets every
// CommitInterval, TLS and SASL. It negotiates protocol versions with the
// brokers, so brokers.KafkaConfig.Version applies to the publisher only.
//
// The publisher maps brokers.KafkaConfig onto Sarama: Version (default 3.6.0, verified
// against kfake), and a sync producer with acks=all, up to 10 retries and
// idempotence (Kafka 0.11+), so a retried produce is not written twice.
//
// TLS and SASL are passed through to both: TLS with optional CA and client
// certificate files; SASL PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512 (franz-go's
// SCRAM client, adapted for Sarama). The SASL password is redacted whenever
// a brokers.KafkaConfig is printed.
//
// # Start-up
//
// NewPublisher retries while no broker is reachable, and so does the first
// contact of each Subscribe, until brokers.KafkaConfig.DialTimeout passes or the
// context (NewPublisher's, or Subscribe's) ends; after that, the
// subscriber's client reconnects and rejoins by itself. NewSubscriber does
// not connect at all.
//
// # Development broker
//
// brokers/kafka/kafkatest runs a Kafka-protocol broker in process (kfake),
// for tests, demos and CI without a Kafka installation;
// framework/cmd/devkafka runs it as a program. Short group timeouts
// (SessionTimeout 1-3s, RebalanceTimeout a few seconds) speed up unit
// tests; the process-level tests and the chaos run use the defaults.
package kafka
