package pg

import (
	"context"

	"github.com/jackc/pgx/v5"
)

// Querier reads one row: a transaction, a connection or a pool.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Lacking returns, in one round trip, whether table (a qualified, quoted
// name) exists and which of privileges (in their order) the current role
// does not have on it. A table that does not exist lacks nothing: whether
// that is an error is the caller's to say.
func Lacking(ctx context.Context, db Querier, table string, privileges ...string) (exists bool, lacking []string, err error) {
	err = db.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL, coalesce((
  SELECT array_agg(p ORDER BY o) FROM unnest($2::text[]) WITH ORDINALITY AS u(p, o)
  WHERE has_table_privilege(to_regclass($1), p) IS FALSE), '{}')`, table, privileges).Scan(&exists, &lacking)
	return exists, lacking, err
}
