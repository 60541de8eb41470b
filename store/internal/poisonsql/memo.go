package poisonsql

// The poison memo (<claims table>_poison_memo, migration 004): the
// (consumer, key) of every dead-lettered message, with the reason, the
// last time a copy was poisoned and how many were. The claim middleware
// looks memos up in its claim's round trip (claimsql); the consumer records
// them, retention deletes them, and the operator commands read and clear
// them through pg.MemosOf.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/claimtx/claimtx/internal/pg"
	"github.com/claimtx/claimtx/internal/poison"
)

// Memos returns the memo statements of n's schema, run on db.
func Memos(db pg.DB, n *pg.Names) pg.Memos { return memos{db, n} }

type memos struct {
	db pg.DB
	n  *pg.Names
}

// Record upserts the memo of (consumer, key) after a copy of its
// message was poisoned because of err: a new memo holds err's text, an
// existing one is counted and stamped. A copy poisoned by its memo (a
// *HitError) only counts and stamps it, keeping the reason that explains
// the failure, and a memo cleared meanwhile stays cleared: writing it
// again would undo an unpoison that landed after the copy was published.
func (t memos) Record(ctx context.Context, consumer, key string, err error) error {
	var qerr error
	if poison.IsHit(err) {
		_, qerr = t.db.Exec(ctx, t.n.Render(`UPDATE {schema}.{memo} SET poisoned_at = now(), seen = seen + 1
WHERE consumer = $1 AND message_key = $2`), consumer, key)
	} else {
		_, qerr = t.db.Exec(ctx, t.n.Render(`INSERT INTO {schema}.{memo} AS m (consumer, message_key, reason) VALUES ($1, $2, $3)
ON CONFLICT (consumer, message_key) DO UPDATE
SET reason = EXCLUDED.reason, poisoned_at = now(), seen = m.seen + 1`), consumer, key, poison.StoredReason(err.Error()))
	}
	return pg.Wrap(qerr, "claimtx: record poison memo")
}

// Get returns the memo of (consumer, key); ok is false when there is none.
func (t memos) Get(ctx context.Context, consumer, key string) (m pg.Memo, ok bool, err error) {
	m = pg.Memo{Consumer: consumer, Key: key}
	err = t.db.QueryRow(ctx, t.n.Render("SELECT reason, poisoned_at, seen FROM {schema}.{memo} WHERE consumer = $1 AND message_key = $2"),
		consumer, key).Scan(&m.Reason, &m.PoisonedAt, &m.Seen)
	if errors.Is(err, pgx.ErrNoRows) {
		return pg.Memo{}, false, nil
	}
	if err != nil {
		return pg.Memo{}, false, fmt.Errorf("claimtx: read poison memo: %w", err)
	}
	return m, true, nil
}

// where renders f as a WHERE clause over $1… and returns its arguments.
func where(f pg.MemoFilter) (string, []any, error) {
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

// Clear removes the memos f matches and returns how many there were
// (`claimtx unpoison`). The next copy of such a message runs the handler.
func (t memos) Clear(ctx context.Context, f pg.MemoFilter) (int64, error) {
	where, args, err := where(f)
	if err != nil {
		return 0, err
	}
	tag, err := t.db.Exec(ctx, t.n.Render("DELETE FROM {schema}.{memo} WHERE ")+where, args...)
	return tag.RowsAffected(), pg.Wrap(err, "claimtx: clear poison memos")
}

// Count is a dry run of Clear.
func (t memos) Count(ctx context.Context, f pg.MemoFilter) (int64, error) {
	where, args, err := where(f)
	if err != nil {
		return 0, err
	}
	var c int64
	err = t.db.QueryRow(ctx, t.n.Render("SELECT count(*) FROM {schema}.{memo} WHERE ")+where, args...).Scan(&c)
	return c, pg.Wrap(err, "claimtx: count poison memos")
}

// Exists reports whether the memo table exists, so tools run
// against an older schema skip memos instead of failing.
func (t memos) Exists(ctx context.Context) (bool, error) {
	var ok bool
	err := t.db.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", t.n.Render("{schema}.{memo}")).Scan(&ok)
	return ok, pg.Wrap(err, "claimtx: look for the poison memo table")
}

// DeleteMemosBefore deletes up to limit memos last poisoned before horizon,
// oldest first, and returns how many it deleted.
func DeleteMemosBefore(ctx context.Context, db pg.DB, n *pg.Names, horizon time.Time, limit int) (int64, error) {
	tag, err := db.Exec(ctx, n.Render(`DELETE FROM {schema}.{memo} WHERE ctid = ANY (ARRAY(
    SELECT ctid FROM {schema}.{memo} WHERE poisoned_at < $1 ORDER BY poisoned_at LIMIT $2)) AND poisoned_at < $1`), horizon, limit)
	return tag.RowsAffected(), pg.Wrap(err, "claimtx: delete expired poison memos")
}

// CountMemosBefore is a dry run of DeleteMemosBefore.
func CountMemosBefore(ctx context.Context, db pg.DB, n *pg.Names, horizon time.Time) (int64, error) {
	var c int64
	err := db.QueryRow(ctx, n.Render("SELECT count(*) FROM {schema}.{memo} WHERE poisoned_at < $1"), horizon).Scan(&c)
	return c, pg.Wrap(err, "claimtx: count expired poison memos")
}

// Memoised returns which of keys have a memo for consumer.
func (t memos) Memoised(ctx context.Context, consumer string, keys []string) (map[string]bool, error) {
	out := make(map[string]bool)
	if len(keys) == 0 {
		return out, nil
	}
	rows, err := t.db.Query(ctx, t.n.Render("SELECT message_key FROM {schema}.{memo} WHERE consumer = $1 AND message_key = ANY($2)"), consumer, keys)
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

// Lacking returns, in one round trip, whether table (a qualified, quoted
// name) exists and which of privileges (in their order) the current role
// does not have on it. A table that does not exist lacks nothing: whether
// that is an error is the caller's to say.
func Lacking(ctx context.Context, db pg.DB, table string, privileges ...string) (exists bool, lacking []string, err error) {
	err = db.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL, coalesce((
  SELECT array_agg(p ORDER BY o) FROM unnest($2::text[]) WITH ORDINALITY AS u(p, o)
  WHERE has_table_privilege(to_regclass($1), p) IS FALSE), '{}')`, table, privileges).Scan(&exists, &lacking)
	return exists, lacking, err
}
