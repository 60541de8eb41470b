package console

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/claimtx/claimtx/internal/dlq"
)

// shortDuration renders an age the way an operator reads one: 3d4h, 5h2m,
// 40s (as `claimtx dlq list` does).
func shortDuration(a time.Duration) string {
	switch {
	case a < 0:
		return "0s"
	case a < time.Minute:
		return a.Round(time.Second).String()
	case a < time.Hour:
		return fmt.Sprintf("%dm%ds", int(a.Minutes()), int(a.Seconds())%60)
	case a < 24*time.Hour:
		return fmt.Sprintf("%dh%dm", int(a.Hours()), int(a.Minutes())%60)
	}
	return fmt.Sprintf("%dd%dh", int(a.Hours())/24, int(a.Hours())%24)
}

// formatDuration prints a retention or horizon: whole days as "30d".
func formatDuration(d time.Duration) string {
	const day = 24 * time.Hour
	if d > 0 && d%day == 0 {
		return fmt.Sprintf("%dd", d/day)
	}
	// "12h", not "12h0m0s": drop the zero units Go prints.
	out := d.String()
	if strings.HasSuffix(out, "m0s") {
		out = strings.TrimSuffix(out, "0s")
		if strings.HasSuffix(out, "h0m") {
			out = strings.TrimSuffix(out, "0m")
		}
	}
	return out
}

// timestamp prints a time in UTC, to the second; "—" for none.
func timestamp(t any) string {
	switch v := t.(type) {
	case time.Time:
		if v.IsZero() {
			return "—"
		}
		return v.UTC().Format("2006-01-02 15:04:05Z")
	case *time.Time:
		if v == nil || v.IsZero() {
			return "—"
		}
		return v.UTC().Format("2006-01-02 15:04:05Z")
	}
	return "—"
}

var daysPrefix = regexp.MustCompile(`^(\d+)d(.*)$`)

// parseDuration accepts Go durations and days ("3d", "1d12h"), as the
// CLI's flags do.
func parseDuration(s string) (time.Duration, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return 0, nil
	}
	var d time.Duration
	if m := daysPrefix.FindStringSubmatch(s); m != nil {
		days, err := strconv.Atoi(m[1])
		if err != nil || days > 100*365 {
			return 0, fmt.Errorf("%q: too many days", s)
		}
		d = time.Duration(days) * 24 * time.Hour
		if s = m[2]; s == "" {
			return d, nil
		}
	}
	rest, err := time.ParseDuration(s)
	if err != nil || rest < 0 {
		return 0, fmt.Errorf("%q is not a duration (e.g. 2h, 3d, 1d12h)", s)
	}
	return d + rest, nil
}

// classText is the class of a letter as the pages show it.
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

// previewBytes bounds a payload shown in a page.
const previewBytes = 4 << 10

// preview renders a payload for a page: text when it is UTF-8, else
// base64, cut at previewBytes.
func preview(b []byte) string {
	cut := ""
	if len(b) > previewBytes {
		b, cut = b[:previewBytes], fmt.Sprintf(" … (first %d bytes shown)", previewBytes)
	}
	if utf8.Valid(b) {
		return string(b) + cut
	}
	return "base64: " + base64.StdEncoding.EncodeToString(b) + cut
}

// oneLine makes s fit a table cell.
func oneLine(s string, max int) string {
	s = strings.Join(strings.Fields(s), " ")
	if utf8.RuneCountInString(s) > max {
		r := []rune(s)
		s = string(r[:max-1]) + "…"
	}
	return s
}

// readOnly runs f in a read-only transaction whose statements time out
// after the console's query timeout: a page never waits on a slow query
// for long, and a timeout is errTimedOut, shown in the cell.
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
