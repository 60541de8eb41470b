package pg

import (
	"context"
	"strconv"
	"time"
)

// Millis renders d for a timeout setting (lock_timeout,
// statement_timeout): whole milliseconds, at least 1 (0 would mean "wait
// forever").
func Millis(d time.Duration) string {
	return strconv.FormatInt(max(d.Milliseconds(), 1), 10) + "ms"
}

// Sleep waits for d or until ctx is done, returning ctx.Err() in the
// latter case.
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

// Every calls f every d until ctx is done or f returns false.
func Every(ctx context.Context, d time.Duration, f func() bool) {
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if !f() {
				return
			}
		}
	}
}
