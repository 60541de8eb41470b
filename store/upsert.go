package store

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/internal/pg"
)

// Execer runs one statement: a pgx.Tx, *pgxpool.Pool or *pgx.Conn.
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// defaultVersionColumn is VersionedUpsertConfig.Version when left empty.
const defaultVersionColumn = "version"

// VersionedUpsertConfig describes a last-writer-wins projection table.
// Names are validated like claimtx's own (^[a-z_][a-z0-9_]*$, at most 63
// bytes) and always quoted; exotic table names need a view.
type VersionedUpsertConfig struct {
	Schema string // qualifies Table; defaults to "" (the search_path)
	Table  string // the projection table; required
	// Key lists the columns of the table's primary key or of a unique
	// constraint: the identity of one projected entity. Required.
	Key []string
	// Version is the column holding the producer's version of the state:
	// a write applies only when its version is strictly greater than the
	// stored one. Defaults to "version".
	Version string
	// Columns are the other columns written (the projected state). They
	// are inserted, and replaced on a newer version. Defaults to none.
	Columns []string
}

// VersionedUpsert writes state rows that tolerate duplicates and
// reordering without any claim: an older or equal version never overwrites
// a newer one. It builds, once,
//
//	INSERT INTO t AS t (key…, version, columns…) VALUES ($1, …)
//	ON CONFLICT (key…) DO UPDATE SET version = EXCLUDED.version, columns… = EXCLUDED.columns…
//	WHERE t.version < EXCLUDED.version
//
// Use it for state (an address, a status), never for increments. It is
// safe for concurrent use.
type VersionedUpsert struct {
	sql   string
	nargs int
}

// NewVersionedUpsert validates cfg and builds the statement. Errors are
// *framework.ConfigError naming the field.
func NewVersionedUpsert(cfg VersionedUpsertConfig) (*VersionedUpsert, error) {
	cfg.Version = cmp.Or(cfg.Version, defaultVersionColumn)
	if cfg.Schema != "" && !schemaName.MatchString(cfg.Schema) {
		return nil, &framework.ConfigError{Field: "Schema", Reason: fmt.Sprintf("%q must match %s", cfg.Schema, schemaName)}
	}
	if !schemaName.MatchString(cfg.Table) {
		return nil, &framework.ConfigError{Field: "Table", Reason: fmt.Sprintf("%q must match %s", cfg.Table, schemaName)}
	}
	if len(cfg.Key) == 0 {
		return nil, &framework.ConfigError{Field: "Key", Reason: "must name at least one column"}
	}
	// The columns in argument order: Key, then Version, then Columns.
	all := append(append(slices.Clone(cfg.Key), cfg.Version), cfg.Columns...)
	seen := map[string]string{}
	cols, params := make([]string, len(all)), make([]string, len(all))
	for i, col := range all {
		field := "Columns"
		switch {
		case i < len(cfg.Key):
			field = "Key"
		case i == len(cfg.Key):
			field = "Version"
		}
		if !schemaName.MatchString(col) {
			return nil, &framework.ConfigError{Field: field, Reason: fmt.Sprintf("column %q must match %s", col, schemaName)}
		}
		if prev, dup := seen[col]; dup {
			return nil, &framework.ConfigError{Field: field, Reason: fmt.Sprintf("column %q is also in %s", col, prev)}
		}
		seen[col] = field
		cols[i], params[i] = pg.Ident(col), fmt.Sprintf("$%d", i+1)
	}
	table := pg.Ident(cfg.Table)
	if cfg.Schema != "" {
		table = pg.Ident(cfg.Schema, cfg.Table)
	}
	// Version and the state columns are replaced by a newer version.
	var sets []string
	for _, c := range cols[len(cfg.Key):] {
		sets = append(sets, c+" = EXCLUDED."+c)
	}
	v := cols[len(cfg.Key)]
	sql := fmt.Sprintf("INSERT INTO %s AS t (%s) VALUES (%s) ON CONFLICT (%s) DO UPDATE SET %s WHERE t.%s < EXCLUDED.%s",
		table, strings.Join(cols, ", "), strings.Join(params, ", "), strings.Join(cols[:len(cfg.Key)], ", "),
		strings.Join(sets, ", "), v, v)
	return &VersionedUpsert{sql: sql, nargs: len(all)}, nil
}

// Exec writes one entity's state through db, args in configuration order
// (Key columns, Version, Columns). applied is false when the stored
// version was already at least as new, which is not an error; under the
// natural-key mode a handler can then return framework.ErrAlreadyApplied.
func (u *VersionedUpsert) Exec(ctx context.Context, db Execer, args ...any) (applied bool, err error) {
	if db == nil {
		return false, errors.New("claimtx: versioned upsert needs a transaction, pool or connection")
	}
	if len(args) != u.nargs {
		return false, framework.Permanent(fmt.Errorf("claimtx: versioned upsert takes %d values (key columns, version, columns), got %d", u.nargs, len(args)))
	}
	tag, err := db.Exec(ctx, u.sql, args...)
	return tag.RowsAffected() == 1, pg.Wrap(err, "claimtx: versioned upsert")
}
