package store

import "github.com/claimtx/claimtx/internal/pg"

// IsTransient reports whether err is a database failure that retrying the
// whole transaction can overcome: a serialization failure (SQLSTATE
// 40001), a deadlock (40P01), a claim wait past its bound (55P03
// lock_not_available), or a lost, refused or shutting-down connection
// (class 08, 57P01-57P03). A unique violation (23505) is not: the same
// transaction would meet it again. A cancelled or expired context is
// never transient: the caller gave up, and retrying would ignore that.
//
// The claim middleware retries exactly these; a handler or a transaction
// of your own can branch on it the same way.
func IsTransient(err error) bool { return pg.Classify(err).Transient() }
