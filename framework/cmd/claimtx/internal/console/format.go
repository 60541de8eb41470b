package console

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/claimtx/claimtx/framework/cmd/claimtx/internal/dlq"
	"github.com/claimtx/claimtx/framework/cmd/claimtx/internal/opfmt"
)

// timestamp prints a time or *time.Time in UTC to the second; "—" for none.
func timestamp(t any) string {
	var v time.Time
	switch x := t.(type) {
	case time.Time:
		v = x
	case *time.Time:
		if x != nil {
			v = *x
		}
	}
	if v.IsZero() {
		return "—"
	}
	return v.UTC().Format("2006-01-02 15:04:05Z")
}

// parseDuration reads a filter's duration: empty is none.
func parseDuration(s string) (time.Duration, error) {
	if strings.TrimSpace(s) == "" {
		return 0, nil
	}
	return opfmt.ParseDuration(s)
}

func classText(l *dlq.Letter) string {
	switch l.Class {
	case dlq.ClassApplied:
		if l.Match == dlq.MatchDifferent {
			return "already applied (DIFFERENT payload)"
		}
		return "already applied"
	case dlq.ClassWouldApply:
		return "would apply"
	case dlq.ClassStillBad:
		return "still bad"
	case dlq.ClassMemo:
		return "poison memo"
	}
	return "—"
}

const previewBytes = 4 << 10

// preview renders a payload for a page, cut at previewBytes.
func preview(b []byte) string {
	s, cut := opfmt.Payload(b, previewBytes)
	if cut {
		s += fmt.Sprintf(" … (first %d bytes shown)", previewBytes)
	}
	return s
}

// readOnly runs f in a read-only transaction whose statements time out
// after the query timeout (errTimedOut, shown in the cell).
func (c *Console) readOnly(ctx context.Context, f func(pgx.Tx) error) error {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.QueryTimeout+2*time.Second)
	defer cancel()
	err := pgx.BeginTxFunc(ctx, c.cfg.Pool, pgx.TxOptions{AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, fmt.Sprintf("SET LOCAL statement_timeout = %d", c.cfg.QueryTimeout.Milliseconds())); err != nil {
			return err
		}
		return f(tx)
	})
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == "57014" || errors.Is(err, context.DeadlineExceeded) {
		return errTimedOut
	}
	return err
}
