// Package dlq browses, classifies and replays a consumer's poison
// destination (its dead letters): the machinery of `claimtx dlq`, kept
// here so the web console can reuse it.
//
// Open returns a Source over the destination as it was when opened;
// Next hands out its letters in destination order without consuming
// them, a Classifier classifies each against the claims with today's key
// spec, and Settle republishes the selected ones to their source topic,
// removing a letter (or, on Kafka, recording the replay progress of group
// ProgressGroup(consumer)) only once the broker confirmed its copy.
// Killed at any point, nothing is lost: every message is still in the
// destination, republished, or both (a duplicate for its claim). How each
// broker browses and confirms, and the classes: docs/operations.md,
// "Dead letters: claimtx dlq".
//
// NATS has no unacked hold as RabbitMQ does: two replays at once may read
// the same letters and republish a message twice, a duplicate for its
// claim.
package dlq
