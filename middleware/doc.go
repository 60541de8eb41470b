// Package middleware holds claimtx's Watermill middleware.
//
// Claim gives a handler exactly-once effects in Postgres on top of an
// at-least-once broker. For each message, in one transaction:
//
//	BEGIN
//	  INSERT INTO claimtx.processed_messages (consumer, message_key)
//	       VALUES ($1, $2) ON CONFLICT DO NOTHING   -- bounded by ClaimWait
//	  handler(msg) with the tx in its context        -- only if the claim inserted
//	COMMIT
//	return nil -> the router acks
//
// A duplicate (the claim already committed) commits without calling the
// handler and is acked. A handler error or panic rolls back claim and effect
// together and returns the error, so the broker redelivers. Transient
// database failures retry the whole transaction with a fresh one.
//
// # Wiring
//
//	claim := middleware.Claim{Store: st, Consumer: "loyalty", Key: key}
//	if err := claim.Validate(); err != nil { return err }
//	h := router.AddConsumerHandler("loyalty", "orders", sub,
//		middleware.TxHandler(func(ctx context.Context, tx pgx.Tx, msg *message.Message) error {
//			_, err := tx.Exec(ctx, "UPDATE balances SET points = points + $1 WHERE customer_id = $2", …)
//			return err
//		}))
//	h.AddMiddleware(claim.Middleware)
//
// Watermill runs middleware in the order they were added, router-level and
// handler-level alike; put Recoverer, Poison and Retry before the claim.
//
// # What the middleware does not do
//
// It does not ack or nack itself: the router does, from the returned error.
// It does not make effects outside Postgres exactly-once: an HTTP call made
// from the handler can happen again when the transaction rolls back. Until
// claimtx's outbox is configured, a handler that returns messages under the
// claim fails with ErrProducedMessages instead of letting the router publish
// them outside the transaction.
//
// Unlike Watermill's own Deduplicator (an in-memory, time-limited set of
// payload hashes, recorded before the handler runs), the claim commits
// atomically with the effect, survives restarts, is shared by every
// instance, and is only recorded when the effect is.
package middleware
