// Package dlq browses, classifies and replays a consumer's poison
// destination (its dead letters): the machinery of `claimtx dlq`, kept
// here so the web console can reuse it.
//
// A letter is removed (on Kafka: passed by the replay progress of group
// ProgressGroup(consumer)) only once the broker confirmed its copy, so a
// kill at any point loses nothing: every message is still in the
// destination, republished, or both (a duplicate for its claim). Brokers
// and classes: docs/operations.md, "Dead letters: claimtx dlq".
//
// NATS has no unacked hold as RabbitMQ does: two replays at once may read
// the same letters and republish a message twice, a duplicate for its
// claim.
package dlq
