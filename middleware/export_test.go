package middleware

import "time"

// ExpiryGuardAt is g with a clock stopped at now, for the black-box tests.
func ExpiryGuardAt(g ExpiryGuard, now time.Time) ExpiryGuard {
	g.now = func() time.Time { return now }
	return g
}
