package middleware

import (
	"cmp"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/internal/pg"
)

// ExpiryGuard refuses messages too old to be deduplicated. Claims are kept
// for a retention window (store.Cleanup, store.DropExpiredPartitions);
// a message whose event time is older than now minus that window may have
// had its claim deleted, so the claim can no longer say whether its effect
// was applied. Applying it could apply it twice; acking it could lose it.
// The guard does neither: it returns a permanent *framework.ExpiredError
// (with the times), so the Poison middleware routes the message to the
// dead-letter destination with the reason, for a person to decide
// (outcome framework.Expired).
//
// Put it before Claim, after Poison:
//
//	Recoverer -> Poison -> Retry -> ExpiryGuard -> Claim -> handler
//
// (Retry never retries a permanent error.) The guard is consistent with
// cleanup because a message is always processed after it was produced:
// its claim's processed_at is no older than its event time, so a message
// inside the window by event time still has its claim. Keep Retention no
// longer than the cleanup window, minus the largest producer clock skew
// you expect (an event time from a clock running fast looks younger than
// the message is).
type ExpiryGuard struct {
	// Retention is the claim retention window, the same value given to
	// cleanup or partition maintenance (store.RetentionConfig.Retention).
	// Defaults to 30 days, the same default.
	Retention time.Duration
	// EventTime reads the producer's event time of a message
	// (framework.ParseTimeSpec("metadata:event_time"), "json:occurred_at",
	// "kafka:timestamp"). Required. A message without a readable event
	// time fails with a permanent *framework.EventTimeError and is
	// poisoned too: it cannot be checked either. Prefer a time the
	// producer wrote: "kafka:timestamp"
	// is accepted, but a copy restamped on the way (a LogAppendTime topic,
	// a producer other than claimtx's Kafka publisher) looks young, so an
	// expired replay whose claim is gone is applied again instead of
	// refused. Claim, which routes partitions by the same time, refuses it
	// without Claim.AllowBrokerEventTime.
	EventTime framework.TimeFunc
	// AllowExpired applies expired messages anyway, after calling
	// OnExpired. Sharp edge: an expired message whose claim was already
	// deleted is applied a second time; use it only to replay a dead-letter
	// queue on purpose, after checking the effects did not happen.
	// Defaults to false.
	AllowExpired bool
	// OnExpired, when set, is called for every expired message, whether
	// refused or (AllowExpired) applied, on the handler goroutine: count
	// it (outcome framework.Expired), log it.
	OnExpired func(msg *message.Message, err *framework.ExpiredError)

	now func() time.Time // the clock, time.Now; tests set another
}

// NewExpiryGuard validates g and returns its middleware. A configuration
// error is returned here, so a guard that would fail every message (a hot
// redelivery loop) cannot be installed.
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
			// Whatever the extractor returned, the same message fails the
			// same way: poison it, never retry it.
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
