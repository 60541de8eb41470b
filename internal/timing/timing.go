// Package timing holds the one wait every background loop of claimtx makes
// between attempts (a retry backoff, a poll interval, a retention pause):
// a sleep that ends early when the context does.
package timing

import (
	"context"
	"time"
)

// Sleep waits for d, or until ctx is done, whichever comes first. It
// returns ctx.Err() when ctx ended the wait and nil when d elapsed.
func Sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
