package store

import "github.com/claimtx/claimtx/internal/pg"

// IsTransient reports whether err is a database failure that retrying the
// whole transaction can overcome, the ones the claim middleware retries: a
// serialization failure (SQLSTATE 40001), a deadlock (40P01), a claim wait
// past its bound (55P03), or a lost, refused or shutting-down connection
// (class 08, 57P01-57P03). A unique violation (23505) and a cancelled or
// expired context are not.
func IsTransient(err error) bool { return pg.Classify(err).Transient() }
