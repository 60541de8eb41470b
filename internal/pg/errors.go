package pg

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// Cause is what made a database operation fail, for the retry decision.
// This file is the one place in claimtx that reads SQLSTATE codes.
type Cause int

const (
	// None: not a recognised transient condition (including nil).
	None Cause = iota
	// Serialization: SQLSTATE 40001. A retry sees the committed twin.
	Serialization
	// Deadlock: SQLSTATE 40P01.
	Deadlock
	// ClaimWait: SQLSTATE 55P03, a lock wait past lock_timeout.
	ClaimWait
	// Connection: the connection was lost or could not be made, or the
	// server is shutting down (SQLSTATE class 08, 57P01-57P03).
	Connection
	// UniqueViolation: SQLSTATE 23505. Not transient: the handler's own
	// effect conflicted, and a retry will meet it again.
	UniqueViolation
)

// String returns the label used in metrics and retry reports.
func (c Cause) String() string {
	if c < 0 || int(c) >= len(causeLabels) {
		return causeLabels[None]
	}
	return causeLabels[c]
}

var causeLabels = [...]string{None: "none", Serialization: "serialization", Deadlock: "deadlock",
	ClaimWait: "claim_wait", Connection: "connection", UniqueViolation: "unique_violation"}

// Transient reports whether retrying the whole transaction can succeed.
func (c Cause) Transient() bool {
	switch c {
	case Serialization, Deadlock, ClaimWait, Connection:
		return true
	}
	return false
}

// Classify returns the Cause of err. A cancelled or expired context is
// None: the caller gave up.
func Classify(err error) Cause {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return None
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		code := pgErr.Code
		switch {
		case code == "40001":
			return Serialization
		case code == "40P01":
			return Deadlock
		case code == "55P03":
			return ClaimWait
		case code == "23505":
			return UniqueViolation
		case strings.HasPrefix(code, "08"), code == "57P01", code == "57P02", code == "57P03":
			return Connection
		}
		return None
	}
	var connErr *pgconn.ConnectError
	var netErr net.Error
	if pgconn.SafeToRetry(err) || errors.As(err, &connErr) || errors.As(err, &netErr) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) {
		return Connection
	}
	return None
}

// SQLState returns the SQLSTATE of err, or "" when err carries none, for
// the store's few translations of specific codes into claimtx errors.
func SQLState(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}

// Wrap returns nil for a nil err, else err prefixed with what ("what: err").
func Wrap(err error, what string) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%s: %w", what, err)
}
