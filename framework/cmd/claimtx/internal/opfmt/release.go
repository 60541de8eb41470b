package opfmt

import (
	"cmp"
	"time"

	"github.com/claimtx/claimtx/internal/pg"
)

// Release says when a parked order key is next released: a pending
// operator request and who made it (the failed release that follows
// clears it), an automatic release (PARK_RETRY), or none until asked.
func Release(k pg.ParkedKey, now time.Time) string {
	switch {
	case k.SkipHead:
		return "skip requested by " + cmp.Or(k.RequestedBy, "?")
	case k.RequestedBy != "":
		return "retry requested by " + k.RequestedBy
	case k.RetryAt != nil && !k.RetryAt.After(now):
		return "due now"
	case k.RetryAt != nil:
		return "automatic in " + Age(k.RetryAt.Sub(now))
	}
	return "on request"
}
