package pg

import (
	"context"
	"time"
)

// Sleep waits for d, or until ctx is done, whichever comes first. It
// returns ctx.Err() when ctx ended the wait and nil when d elapsed. It is
// the one wait every Postgres loop of claimtx makes between attempts (a
// retry backoff, a poll interval, a retention pause).
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
