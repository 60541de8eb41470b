package consumer

import "time"

// SetDurabilityIntervalForTest makes running consumers check for a
// synchronous standby every d, until restore is called. For tests that do
// not run in parallel: the interval is the package's.
func SetDurabilityIntervalForTest(d time.Duration) (restore func()) {
	old := durabilityInterval
	durabilityInterval = d
	return func() { durabilityInterval = old }
}
