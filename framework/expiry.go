package framework

import (
	"fmt"
	"time"
)

// ExpiredError means the message is older than the claim retention horizon:
// its claim may be gone, so applying it could apply it twice and dropping it
// could lose it. It is poisoned (outcome Expired) for a person to decide;
// permanent, as time only makes it older.
type ExpiredError struct {
	EventTime time.Time     // the producer's event time
	Horizon   time.Time     // now minus Retention: older claims may be gone
	Retention time.Duration // the claim retention window
}

func (e *ExpiredError) Error() string {
	return fmt.Sprintf("claimtx: message expired: event time %s is older than the claim retention horizon %s (retention %s), so its claim can no longer be checked; not applied",
		e.EventTime.UTC().Format(time.RFC3339), e.Horizon.UTC().Format(time.RFC3339), formatRetention(e.Retention))
}

func (e *ExpiredError) permanent() {}

// formatRetention prints whole days as "30d", else a Go duration.
func formatRetention(d time.Duration) string {
	const day = 24 * time.Hour
	if d > 0 && d%day == 0 {
		return fmt.Sprintf("%dd", d/day)
	}
	return d.String()
}
