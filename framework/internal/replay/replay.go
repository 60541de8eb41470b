// Package replay asks a subscriber for its replay horizon (the contract is
// package brokers'), for framework/consumer and the claimtx command.
package replay

import (
	"context"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/claimtx/claimtx/brokers"
)

type reporter interface {
	ReplayHorizon(ctx context.Context, topic string) (time.Duration, error)
}

// Horizon returns the longest replay horizon of topics on sub: how old a
// message can be when the broker still delivers it. ok is false when sub
// has no ReplayHorizon method.
func Horizon(ctx context.Context, sub message.Subscriber, topics ...string) (longest time.Duration, ok bool, err error) {
	r, ok := sub.(reporter)
	if !ok {
		return 0, false, nil
	}
	for _, t := range topics {
		d, err := r.ReplayHorizon(ctx, t)
		if err != nil {
			return 0, true, err
		}
		longest = max(longest, d)
	}
	return longest, true, nil
}

// Format prints a replay horizon: "unbounded" or the duration.
func Format(d time.Duration) string {
	if d == brokers.UnboundedHorizon {
		return "unbounded"
	}
	return d.String()
}
