package store

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// Cause classifies a database error for the retry decision. It is the one
// place in claimtx that looks at SQLSTATE codes; everything else branches on
// Cause or IsTransient, never on error text.
type Cause int

const (
	// CauseNone: not a recognised transient condition (including nil).
	CauseNone Cause = iota
	// CauseSerialization: SQLSTATE 40001, a SERIALIZABLE or REPEATABLE READ
	// conflict. Retrying the whole transaction sees the committed twin.
	CauseSerialization
	// CauseDeadlock: SQLSTATE 40P01.
	CauseDeadlock
	// CauseClaimWait: SQLSTATE 55P03 lock_not_available, raised when the
	// claim (or any lock) waited longer than lock_timeout behind a twin.
	CauseClaimWait
	// CauseConnection: the connection was lost or could not be made, or
	// the server is shutting down (SQLSTATE class 08, 57P01-57P03).
	CauseConnection
	// CauseUniqueViolation: SQLSTATE 23505. Not transient: inside the claim
	// transaction it means the handler's own effect conflicted, which a retry
	// of the same message will meet again. Natural-key modes use ON CONFLICT
	// rather than relying on it.
	CauseUniqueViolation
)

// String returns the label used in metrics ("serialization", "deadlock",
// "claim_wait", "connection", "unique_violation", "none").
func (c Cause) String() string {
	switch c {
	case CauseSerialization:
		return "serialization"
	case CauseDeadlock:
		return "deadlock"
	case CauseClaimWait:
		return "claim_wait"
	case CauseConnection:
		return "connection"
	case CauseUniqueViolation:
		return "unique_violation"
	}
	return "none"
}

// Transient reports whether retrying the whole transaction can succeed.
func (c Cause) Transient() bool {
	switch c {
	case CauseSerialization, CauseDeadlock, CauseClaimWait, CauseConnection:
		return true
	}
	return false
}

// Classify returns the Cause of err. A cancelled or expired context is never
// transient: the caller gave up, and retrying would ignore that.
func Classify(err error) Cause {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return CauseNone
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		code := pgErr.Code
		switch {
		case code == "40001":
			return CauseSerialization
		case code == "40P01":
			return CauseDeadlock
		case code == "55P03":
			return CauseClaimWait
		case code == "23505":
			return CauseUniqueViolation
		case strings.HasPrefix(code, "08"), code == "57P01", code == "57P02", code == "57P03":
			return CauseConnection
		}
		return CauseNone
	}
	var connErr *pgconn.ConnectError
	var netErr net.Error
	switch {
	case pgconn.SafeToRetry(err),
		errors.As(err, &connErr),
		errors.As(err, &netErr),
		errors.Is(err, io.EOF),
		errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, net.ErrClosed):
		return CauseConnection
	}
	// pgx reports a connection that died mid-query as a plain error whose
	// only structured trait is that the conn is closed afterwards; the
	// wrapped error is usually one of the above. Anything else is not ours
	// to guess about.
	return CauseNone
}

// IsTransient reports whether Classify(err) is a transient cause.
func IsTransient(err error) bool { return Classify(err).Transient() }

// sqlState returns the SQLSTATE of err, or "" when err carries none. It
// lives here so that SQLSTATE codes are read in this file only; retention
// and partition code use it to translate their few specific codes into
// claimtx errors.
func sqlState(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}
