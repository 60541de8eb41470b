package framework

import "errors"

// ErrAlreadyApplied is returned by a handler that found its effect already
// committed by an earlier delivery. It is how the effect's own unique
// constraint becomes the claim (the claim middleware's natural-key mode):
//
//	WITH credit AS (
//	  INSERT INTO point_ledger (customer_id, order_id, points) VALUES ($1, $2, $3)
//	  ON CONFLICT (order_id) DO NOTHING
//	  RETURNING customer_id, points
//	), balance AS (
//	  INSERT INTO balances (customer_id, points) SELECT customer_id, points FROM credit
//	  ON CONFLICT (customer_id) DO UPDATE SET points = balances.points + EXCLUDED.points
//	)
//	SELECT count(*) FROM credit
//
// returns 0 for a duplicate; the handler then returns ErrAlreadyApplied
// (wrapped or not). The claim middleware rolls the transaction back (so
// nothing else the handler wrote in this delivery persists), reports the
// outcome Duplicate and returns nil, so the router acks. It is not an error
// anyone retries or poisons.
//
// It is honoured in claim-table mode too: a handler that keeps a natural
// key as a second line of defence can report what it found. The claim row
// rolls back with everything else, so the next delivery runs the handler
// again and gets the same answer.
var ErrAlreadyApplied = errors.New("claimtx: effect already applied")
