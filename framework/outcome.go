package framework

// Outcome is what happened to one delivery under the claim middleware.
// It is a string so that it can be used directly as a metric label.
// framework/consumer reports one per delivery, when it is acked or nacked
// (docs/observability.md); the claim middleware alone reports one per
// pass.
type Outcome string

const (
	// Applied: the claim inserted, the handler ran and its effect committed.
	Applied Outcome = "applied"
	// Duplicate: the claim already existed (committed by an earlier delivery);
	// the handler did not run and the message is acked.
	Duplicate Outcome = "duplicate"
	// Failed: the transaction rolled back (handler error, invalid key,
	// retries exhausted); nothing was persisted and the error goes back to
	// the router, which retries, poisons or nacks it. As a message's final
	// outcome in framework/consumer: it was nacked.
	Failed Outcome = "failed"
	// Poisoned: the message was routed to the poison/dead-letter destination
	// with the reason and the original acked.
	Poisoned Outcome = "poisoned"
	// Expired: the message is older than the claim retention horizon, so its
	// claim can no longer be checked; it is poisoned rather than applied.
	Expired Outcome = "expired"
)
