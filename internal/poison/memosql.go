package poison

// The SQL of the poison memo (<claims table>_poison_memo, migration 004):
// the (consumer, key) of every dead-lettered message, with the reason, the
// last time a copy was poisoned and how many were. The claim middleware
// looks memos up in its claim's round trip (store/internal/claimsql); the
// CLI, retention and the dead-letter replay use the functions below.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/claimtx/claimtx/internal/pg"
)

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

// DB runs statements: a pool, a connection or a transaction.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Memo is one memo row.
type Memo struct {
	Consumer   string    `json:"consumer"`
	Key        string    `json:"key"`
	Reason     string    `json:"reason"`
	PoisonedAt time.Time `json:"poisoned_at"`
	Seen       int64     `json:"seen"`
}

// RecordMemo upserts the memo of (consumer, key) after a copy of its
// message was poisoned because of err: a new memo holds err's text, an
// existing one is counted and stamped. A copy poisoned by its memo (a
// *HitError) only counts and stamps it, keeping the reason that explains
// the failure, and a memo cleared meanwhile stays cleared: writing it
// again would undo an unpoison that landed after the copy was published.
func RecordMemo(ctx context.Context, db DB, n *pg.Names, consumer, key string, err error) error {
	var qerr error
	if IsHit(err) {
		_, qerr = db.Exec(ctx, n.Render(`UPDATE {schema}.{memo} SET poisoned_at = now(), seen = seen + 1
WHERE consumer = $1 AND message_key = $2`), consumer, key)
	} else {
		_, qerr = db.Exec(ctx, n.Render(`INSERT INTO {schema}.{memo} AS m (consumer, message_key, reason) VALUES ($1, $2, $3)
ON CONFLICT (consumer, message_key) DO UPDATE
SET reason = EXCLUDED.reason, poisoned_at = now(), seen = m.seen + 1`), consumer, key, StoredReason(err.Error()))
	}
	return pg.Wrap(qerr, "claimtx: record poison memo")
}

// GetMemo returns the memo of (consumer, key); ok is false when there is none.
func GetMemo(ctx context.Context, db DB, n *pg.Names, consumer, key string) (m Memo, ok bool, err error) {
	m = Memo{Consumer: consumer, Key: key}
	err = db.QueryRow(ctx, n.Render("SELECT reason, poisoned_at, seen FROM {schema}.{memo} WHERE consumer = $1 AND message_key = $2"),
		consumer, key).Scan(&m.Reason, &m.PoisonedAt, &m.Seen)
	if errors.Is(err, pgx.ErrNoRows) {
		return Memo{}, false, nil
	}
	if err != nil {
		return Memo{}, false, fmt.Errorf("claimtx: read poison memo: %w", err)
	}
	return m, true, nil
}

// MemoFilter selects memos of one consumer: every condition set must hold.
type MemoFilter struct {
	Consumer       string        // required
	Keys           []string      // when not empty, only these keys
	ReasonContains string        // when set, reasons containing it (case sensitive)
	OlderThan      time.Duration // when positive, memos last poisoned longer ago (database clock)
}

// where renders f as a WHERE clause over $1… and returns its arguments.
func (f MemoFilter) where() (string, []any, error) {
	if f.Consumer == "" {
		return "", nil, errors.New("claimtx: poison memo filter: a consumer is required")
	}
	conds, args := []string{"consumer = $1"}, []any{f.Consumer}
	if len(f.Keys) > 0 {
		args = append(args, f.Keys)
		conds = append(conds, fmt.Sprintf("message_key = ANY($%d::text[])", len(args)))
	}
	if f.ReasonContains != "" {
		args = append(args, f.ReasonContains)
		// strpos, not LIKE: % and _ match literally.
		conds = append(conds, fmt.Sprintf("strpos(reason, $%d) > 0", len(args)))
	}
	if f.OlderThan > 0 {
		args = append(args, f.OlderThan.Microseconds())
		conds = append(conds, fmt.Sprintf("poisoned_at < now() - $%d * interval '1 microsecond'", len(args)))
	}
	return strings.Join(conds, " AND "), args, nil
}

// ClearMemo removes the memos of consumer's keys and returns how many there
// were, so the copies the dead-letter replay republishes reach the handler.
func ClearMemo(ctx context.Context, db DB, n *pg.Names, consumer string, keys []string) (int64, error) {
	if len(keys) == 0 {
		return 0, nil
	}
	return ClearMemos(ctx, db, n, MemoFilter{Consumer: consumer, Keys: keys})
}

// ClearMemos removes the memos f matches and returns how many there were
// (`claimtx unpoison`). The next copy of such a message runs the handler.
func ClearMemos(ctx context.Context, db DB, n *pg.Names, f MemoFilter) (int64, error) {
	where, args, err := f.where()
	if err != nil {
		return 0, err
	}
	tag, err := db.Exec(ctx, n.Render("DELETE FROM {schema}.{memo} WHERE ")+where, args...)
	return tag.RowsAffected(), pg.Wrap(err, "claimtx: clear poison memos")
}

// CountMemos is a dry run of ClearMemos.
func CountMemos(ctx context.Context, db DB, n *pg.Names, f MemoFilter) (int64, error) {
	where, args, err := f.where()
	if err != nil {
		return 0, err
	}
	var c int64
	err = db.QueryRow(ctx, n.Render("SELECT count(*) FROM {schema}.{memo} WHERE ")+where, args...).Scan(&c)
	return c, pg.Wrap(err, "claimtx: count poison memos")
}

// MemoTableExists reports whether the memo table exists, so tools run
// against an older schema skip memos instead of failing.
func MemoTableExists(ctx context.Context, db DB, n *pg.Names) (bool, error) {
	var ok bool
	err := db.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", n.Render("{schema}.{memo}")).Scan(&ok)
	return ok, pg.Wrap(err, "claimtx: look for the poison memo table")
}

// DeleteMemosBefore deletes up to limit memos last poisoned before horizon,
// oldest first, and returns how many it deleted.
func DeleteMemosBefore(ctx context.Context, db DB, n *pg.Names, horizon time.Time, limit int) (int64, error) {
	tag, err := db.Exec(ctx, n.Render(`DELETE FROM {schema}.{memo} WHERE ctid = ANY (ARRAY(
    SELECT ctid FROM {schema}.{memo} WHERE poisoned_at < $1 ORDER BY poisoned_at LIMIT $2)) AND poisoned_at < $1`), horizon, limit)
	return tag.RowsAffected(), pg.Wrap(err, "claimtx: delete expired poison memos")
}

// CountMemosBefore is a dry run of DeleteMemosBefore.
func CountMemosBefore(ctx context.Context, db DB, n *pg.Names, horizon time.Time) (int64, error) {
	var c int64
	err := db.QueryRow(ctx, n.Render("SELECT count(*) FROM {schema}.{memo} WHERE poisoned_at < $1"), horizon).Scan(&c)
	return c, pg.Wrap(err, "claimtx: count expired poison memos")
}

// MemoTable is the memo table of one claim table as the dead-letter
// tooling (framework/cmd/claimtx/internal/dlq.Memo) uses it.
type MemoTable struct {
	DB    DB
	Names *pg.Names
}

// Memoised returns which of keys have a memo for consumer.
func (t MemoTable) Memoised(ctx context.Context, consumer string, keys []string) (map[string]bool, error) {
	out := make(map[string]bool)
	if len(keys) == 0 {
		return out, nil
	}
	rows, err := t.DB.Query(ctx, t.Names.Render("SELECT message_key FROM {schema}.{memo} WHERE consumer = $1 AND message_key = ANY($2)"), consumer, keys)
	if err == nil {
		var k string
		_, err = pgx.ForEachRow(rows, []any{&k}, func() error {
			out[k] = true
			return nil
		})
	}
	if err != nil {
		return nil, fmt.Errorf("claimtx: look up poison memos: %w", err)
	}
	return out, nil
}

// Clear removes the memos of consumer for keys.
func (t MemoTable) Clear(ctx context.Context, consumer string, keys []string) error {
	_, err := ClearMemo(ctx, t.DB, t.Names, consumer, keys)
	return err
}
