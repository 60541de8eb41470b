package poison

import (
	"errors"
	"time"

	"github.com/claimtx/claimtx/framework"
)

// HitPrefix starts the reason of a message poisoned by its memo:
// "poison memo: <the reason that poisoned the first copy>".
const HitPrefix = "poison memo: "

// HitError is the (permanent) failure of a delivery whose (consumer, key)
// has a memo: the handler did not run, and the message goes to the poison
// destination with this error as its reason.
type HitError struct {
	// Reason is the memo's reason: the error that poisoned the first copy.
	Reason string
}

func (e *HitError) Error() string { return HitPrefix + e.Reason }

// IsHit reports whether err is, or wraps, a *HitError.
func IsHit(err error) bool {
	var h *HitError
	return errors.As(err, &h)
}

// Memoised reports whether a message poisoned because of err gets a memo:
// not when it was poisoned as expired (older than the claims' retention:
// every copy is expired anyway, and the expiry guard is cheaper than a
// lookup).
func Memoised(err error) bool {
	return err != nil && !errors.As(err, new(*framework.ExpiredError))
}

// MemoRecordTimeout bounds recording one memo. It runs after the poisoned
// copy was published and before the original is acked, on a context
// detached from the message's (a shutdown must not cancel it half-way):
// a database that does not answer delays the ack by this much at most,
// and the memo is then missing, not the message.
const MemoRecordTimeout = 2 * time.Second

// DeadLetterRecordTimeout bounds recording one letter. It runs after the broker
// refused the copy and before the original is acked, on a context detached
// from the message's (a shutdown must not cancel it half-way): a database
// that does not answer in time leaves the message nacked, so it comes back
// and is tried again; it is never acked without its row.
const DeadLetterRecordTimeout = 5 * time.Second
