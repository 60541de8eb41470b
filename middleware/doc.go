// Package middleware holds claimtx's Watermill middleware.
//
// Claim gives a handler exactly-once effects in Postgres on top of an
// at-least-once broker. For each message, in one transaction:
//
//	BEGIN
//	  INSERT INTO claimtx.processed_messages (consumer, message_key)
//	       VALUES ($1, $2) ON CONFLICT DO NOTHING   -- waits at most MaxClaimWait
//	  handler(msg) with the tx in its context        -- only if the claim inserted
//	COMMIT
//	return nil -> the router acks
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
// Watermill runs middleware in the order they were added; the chain is
//
//	Recoverer -> Poison -> Retry -> ExpiryGuard -> Claim -> handler
//
// Without a poison route, a message that can never be applied (no key, a
// framework.Permanent error) is nacked and redelivered forever. Make the
// effect an upsert, or fail when it touches no row: an UPDATE of a missing
// row changes nothing, and the claim still commits. framework/consumer
// builds this chain from one configuration; examples/quickstart is it,
// complete.
//
// The middleware does not ack or nack itself (the router does, from the
// returned error), and it does not make effects outside Postgres
// exactly-once: write a message to the outbox instead (Store.Enqueue, or
// return it with Claim.OutboxTopic set). ModeNaturalKey uses the effect's
// own unique constraint as the claim (docs/effects.md); NewBatch applies
// many messages in one transaction with a set-wise handler (docs/batch.md).
// Unlike Watermill's Deduplicator, the claim commits atomically with the
// effect, survives restarts and is shared by every instance
// (docs/design.md).
package middleware
