package framework

import (
	"fmt"
	"time"
)

// ExpiredError means "this message is older than the claim retention
// horizon", and says which message time was checked against which horizon.
// Its claim may already have been deleted, so whether its effect was
// applied can no longer be checked: applying it could apply it twice,
// dropping it could lose it. Such a message is routed to the
// poison/dead-letter destination with the reason (outcome Expired) for a
// person to decide. It is permanent: time only makes it older.
type ExpiredError struct {
	// EventTime is the producer's event time read from the message.
	EventTime time.Time
	// Horizon is the oldest event time whose claim is still guaranteed to
	// exist: now minus Retention.
	Horizon time.Time
	// Retention is the claim retention window the horizon was derived from.
	Retention time.Duration
}

func (e *ExpiredError) Error() string {
	return fmt.Sprintf("claimtx: message expired: event time %s is older than the claim retention horizon %s (retention %s), so its claim can no longer be checked; not applied",
		e.EventTime.UTC().Format(time.RFC3339), e.Horizon.UTC().Format(time.RFC3339), formatRetention(e.Retention))
}

func (e *ExpiredError) permanent() {}

// formatRetention prints whole days as "30d" (how operators think of
// retention windows) and anything else as a Go duration.
func formatRetention(d time.Duration) string {
	const day = 24 * time.Hour
	if d > 0 && d%day == 0 {
		return fmt.Sprintf("%dd", d/day)
	}
	return d.String()
}
