// Package outbox relays claimtx's transactional outbox to a broker.
//
// A handler under the claim middleware writes messages to the outbox table
// in its claim transaction (Store.Enqueue, or by returning them with
// middleware.Claim.OutboxTopic set): they exist if and only if the effect
// committed. A Relay publishes them through any Watermill
// message.Publisher and marks them sent, in one transaction per batch:
//
//	BEGIN
//	  SELECT … FROM <schema>.outbox WHERE sent_at IS NULL
//	   ORDER BY id LIMIT <BatchSize> FOR UPDATE SKIP LOCKED
//	  Publish(topic, msgs…)          -- returns after the broker confirmed
//	  UPDATE … SET sent_at = now() WHERE id = ANY(<published>)
//	COMMIT
//
//	relay, err := outbox.New(st, pub, outbox.Config{})
//	go relay.Run(ctx)
//
// Delivery is at least once: a relay that dies between Publish and COMMIT
// loses its marks, and the rows go again, each with the same
// store.IdempotencyKeyMetadata for downstream consumers to deduplicate on.
// Any number of relays share the backlog, never publishing one row at the
// same time. Only a single relay keeps id order (insert, not commit,
// order); consumers that need order must carry it in the data.
// docs/effects.md has the guarantees, ordering and limits.
package outbox
