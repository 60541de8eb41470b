package middleware

import (
	"cmp"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/internal/pg"
)

// ExpiryGuard refuses messages too old to be deduplicated: one whose event
// time is older than the claim retention window may have lost its claim,
// so applying it could apply it twice and acking it could lose it. The
// guard returns a permanent *framework.ExpiredError instead, which Poison
// dead-letters for a person to decide (outcome framework.Expired).
//
// Put it just before Claim (the chain is in the package doc). A message
// inside the window by event time still has its claim; keep Retention no
// longer than the cleanup window minus the producer clock skew you expect
// (docs/operations.md, "The expiry guard").
type ExpiryGuard struct {
	// Retention is the claim retention window, the same value given to
	// cleanup or partition maintenance (store.RetentionConfig.Retention).
	// Defaults to 30 days, the same default.
	Retention time.Duration
	// EventTime reads the producer's event time of a message
	// (framework.ParseTimeSpec("metadata:event_time")). Required. A message
	// without one fails with a permanent *framework.EventTimeError. Prefer
	// a time the producer wrote: "kafka:timestamp" is accepted, but a copy
	// restamped on the way (a LogAppendTime topic, another producer) looks
	// young, so an expired replay whose claim is gone is applied again.
	EventTime framework.TimeFunc
	// AllowExpired applies expired messages anyway, after OnExpired. Sharp
	// edge: one whose claim was deleted is applied again; use it only for a
	// deliberate replay, after checking the effects did not happen.
	AllowExpired bool
	// OnExpired, when set, is called for every expired message, whether
	// refused or (AllowExpired) applied, on the handler goroutine: count
	// it (outcome framework.Expired), log it.
	OnExpired func(msg *message.Message, err *framework.ExpiredError)

	now func() time.Time // the clock, time.Now; tests set another
}

// NewExpiryGuard validates g and returns its middleware, so a guard that
// would fail every message (a hot redelivery loop) cannot be installed.
func NewExpiryGuard(g ExpiryGuard) (message.HandlerMiddleware, error) {
	switch {
	case g.EventTime == nil:
		return nil, &framework.ConfigError{Field: "EventTime", Reason: "must not be nil (e.g. framework.ParseTimeSpec(\"metadata:event_time\"))"}
	case g.Retention < 0:
		return nil, &framework.ConfigError{Field: "Retention", Reason: "must not be negative"}
	}
	return g.middleware, nil
}

func (g ExpiryGuard) middleware(h message.HandlerFunc) message.HandlerFunc {
	g.Retention = cmp.Or(g.Retention, pg.DefaultRetention)
	if g.now == nil {
		g.now = time.Now
	}
	return func(msg *message.Message) ([]*message.Message, error) {
		at, err := g.EventTime(msg)
		if err != nil {
			// The same message fails the same way: poison, never retry.
			return nil, framework.Permanent(fmt.Errorf("claimtx: expiry guard: %w", err))
		}
		horizon := g.now().Add(-g.Retention)
		if !at.Before(horizon) {
			return h(msg)
		}
		expired := &framework.ExpiredError{EventTime: at, Horizon: horizon, Retention: g.Retention}
		if g.OnExpired != nil {
			g.OnExpired(msg, expired)
		}
		if g.AllowExpired {
			return h(msg)
		}
		return nil, expired
	}
}
