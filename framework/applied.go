package framework

import "errors"

// ErrAlreadyApplied is returned (wrapped or not) by a handler that found
// its effect already committed, e.g. by its INSERT ... ON CONFLICT DO
// NOTHING: the effect's own unique constraint is the claim (natural-key
// mode, docs/effects.md). The claim middleware rolls the transaction back,
// reports Duplicate and returns nil, so the router acks. In claim-table mode
// the claim rolls back too, so the next delivery gets the same answer.
var ErrAlreadyApplied = errors.New("claimtx: effect already applied")
