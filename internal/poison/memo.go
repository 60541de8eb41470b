package poison

import (
	"errors"
	"strings"
	"time"
	"unicode/utf8"

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
// not when expired (every copy is, and the expiry guard is cheaper).
func Memoised(err error) bool {
	return err != nil && !errors.As(err, new(*framework.ExpiredError))
}

// MemoRecordTimeout bounds recording one memo, between publishing the
// poisoned copy and acking the original, on a context detached from the
// message's: a database that does not answer delays the ack this much at
// most, and the memo is then missing, not the message.
const MemoRecordTimeout = 2 * time.Second

// DeadLetterRecordTimeout bounds recording one letter, likewise: a
// database that does not answer in time leaves the message nacked, never
// acked without its row.
const DeadLetterRecordTimeout = 5 * time.Second

// MaxMemoReasonBytes bounds a stored reason: the memo only has to say
// which failure it remembers.
const MaxMemoReasonBytes = 2048

// StoredReason makes a reason storable in a text column (no NUL, valid
// UTF-8), at most MaxMemoReasonBytes: the poison memo's and the parked
// tables' reasons.
func StoredReason(s string) string {
	s = strings.ToValidUTF8(strings.ReplaceAll(s, "\x00", ""), "\uFFFD")
	if len(s) <= MaxMemoReasonBytes {
		return s
	}
	cut := MaxMemoReasonBytes
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut]
}
