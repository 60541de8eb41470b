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
//	claim, err := middleware.NewClaim(middleware.Claim{Store: st, Consumer: "loyalty", Key: key})
//	if err != nil { return err } // a bad configuration cannot be installed
//	poison, err := middleware.NewPoison(middleware.Poison{Publisher: pub, Topic: "orders.poison"})
//	if err != nil { return err }
//	h := router.AddConsumerHandler("loyalty", "orders", sub,
//		middleware.TxHandler(func(ctx context.Context, tx pgx.Tx, msg *message.Message) error {
//			_, err := tx.Exec(ctx, "INSERT INTO balances … ON CONFLICT (customer_id) DO UPDATE …", …)
//			return err
//		}))
//	h.AddMiddleware(poison, claim)
//
// Without a poison route, a message that can never be applied (a payload
// with no key, a framework.Permanent error) is nacked and redelivered
// forever. Make the effect an upsert, or fail when it touches no row: an
// UPDATE of a missing row changes nothing, and the claim still commits.
// examples/quickstart (the README's quick start) is this, complete.
//
// Watermill runs middleware in the order they were added, router-level and
// handler-level alike; put Recoverer, Poison (NewPoison) and Retry before
// the claim. NewClaim, NewPoison and NewExpiryGuard return the
// configuration error instead of a middleware, so a broken one cannot be
// installed.
//
// # What the middleware does not do
//
// It does not ack or nack itself: the router does, from the returned error.
// It does not make effects outside Postgres exactly-once: an HTTP call made
// from the handler can happen again when the transaction rolls back. Write
// a message to the outbox instead (Store.Enqueue, or return it with
// Claim.OutboxTopic set): it commits with the claim and a relay (package
// store/outbox) delivers it afterwards with a stable idempotency key.
// Without OutboxTopic, a handler that returns messages under the claim
// fails with ErrProducedMessages instead of letting the router publish them
// outside the transaction.
//
// # Natural-key claims
//
// With Mode: ModeNaturalKey no claim row is written: the handler's own
// guarded statement (INSERT … ON CONFLICT (order_id) DO NOTHING) is the
// claim, and the handler returns framework.ErrAlreadyApplied when it found
// the effect present. Outcomes, hooks and retries are those of the claim
// table; such claims never expire. docs/effects.md compares the claim
// table, natural keys, versioned upserts and the outbox.
//
// Unlike Watermill's own Deduplicator (an in-memory, time-limited set of
// payload hashes, recorded before the handler runs), the claim commits
// atomically with the effect, survives restarts, is shared by every
// instance, and is only recorded when the effect is.
package middleware
