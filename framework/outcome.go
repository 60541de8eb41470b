package framework

// Outcome is what happened to one delivery under the claim middleware, a
// string so that it can be a metric label (docs/observability.md).
type Outcome string

const (
	// Applied: the claim inserted, the handler ran and its effect committed.
	Applied Outcome = "applied"
	// Duplicate: the claim already existed (committed by an earlier delivery);
	// the handler did not run and the message is acked.
	Duplicate Outcome = "duplicate"
	// Failed: the transaction rolled back (handler error, invalid key,
	// retries exhausted) and the error goes back to the router; as a final
	// outcome in framework/consumer: nacked.
	Failed Outcome = "failed"
	// Poisoned: the message was routed to the poison/dead-letter destination
	// with the reason and the original acked.
	Poisoned Outcome = "poisoned"
	// Expired: older than the claim retention horizon (ExpiredError); poisoned.
	Expired Outcome = "expired"
	// Parked: with an order key (middleware.Claim.OrderKey), the message
	// failed for good or its key was parked before it: it is stored, in
	// order, until the key is released, and the original acked.
	Parked Outcome = "parked"
)
