// Package outbox relays claimtx's transactional outbox to a broker.
//
// A handler under the claim middleware writes messages to the outbox table
// in its claim transaction (Store.Enqueue, or by returning them with
// middleware.Claim.OutboxTopic set): they exist if and only if the effect
// committed. A Relay locks a batch of pending rows (FOR UPDATE SKIP
// LOCKED), publishes them through any Watermill message.Publisher and marks
// them sent in the same transaction:
//
//	relay, err := outbox.New(st, pub, outbox.Config{})
//	go relay.Run(ctx)
//
// Delivery is at least once, each row with the same
// store.IdempotencyKeyMetadata for downstream consumers to deduplicate on;
// any number of relays share the backlog, and only a single one keeps id
// order. docs/effects.md has the guarantees, ordering and limits.
package outbox
