// Package wait holds the one timed wait the adapters' retry, backoff and
// nack-delay loops share: a timer that a stop signal cuts short.
package wait

import "time"

// For waits d, or until stop is closed, and reports whether d passed. A
// d <= 0 does not wait, but a stop already closed still wins, as it would
// against a timer that fired at once.
func For(d time.Duration, stop <-chan struct{}) bool {
	if d <= 0 {
		select {
		case <-stop:
			return false
		default:
			return true
		}
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-stop:
		return false
	}
}
