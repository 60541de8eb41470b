package middleware

import "time"

// ExpiryGuardAt is g with a clock stopped at now, for the black-box tests.
func ExpiryGuardAt(g ExpiryGuard, now time.Time) ExpiryGuard {
	g.now = func() time.Time { return now }
	return g
}

// ClaimAt is c with the committed-key cache's clock replaced by now.
func ClaimAt(c Claim, now func() time.Time) Claim {
	c.now = now
	return c
}
