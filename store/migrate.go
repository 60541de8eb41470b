package store

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/claimtx/claimtx/store/internal/migrate"
)

// SchemaVersion is the schema version this build migrates to: Version
// reports it once Migrate has run. A readiness check compares the two.
const SchemaVersion = 8

// Migrate brings the schema to the latest version this build of claimtx
// knows. It is idempotent and safe to call from several processes starting
// at once on an empty database: an advisory lock per schema serialises
// them, and each migration runs in the same transaction as its
// bookkeeping, so a crash leaves either all or none of it.
//
// An up-to-date schema is recognised with reads only, before any lock or
// DDL, so a least-privilege role without CREATE can call Migrate at every
// start-up. Otherwise one transaction takes the lock (a transaction lock:
// no session state, so it works behind a transaction pooler such as
// PgBouncer) and migrates; should it still collide with a schema another
// instance just created (a catalog cache not yet refreshed), it is tried
// again in a new transaction, which sees that schema.
//
// Before anything else it asks BehindTransactionPooler, and refuses a pool
// whose query mode cannot work behind a transaction pooler (pgx's default,
// QueryExecModeCacheStatement, and QueryExecModeDescribeExec) with a
// *framework.ConfigError for Field "Pool" wrapping ErrTransactionPooler: a
// URL for such a pooler needs default_query_exec_mode=exec (or
// cache_describe, or simple_protocol).
func (s *Store) Migrate(ctx context.Context) error {
	if err := s.checkPooler(ctx); err != nil {
		return err
	}
	return migrate.Up(ctx, s.pool, s.names)
}

// MigrateTx is Migrate inside the caller's transaction, for applications
// that run their own migrations in one transaction with claimtx's. It takes
// the advisory lock (a transaction lock, so it works behind a transaction
// pooler as Migrate does) as its first statement; make it the first
// statement of a fresh transaction too. If several processes may migrate
// an empty database at once, a transaction that looked the schema up
// before another one's migration committed can fail with a unique
// violation on a catalog index (SQLSTATE 23505) or a duplicate schema or
// table (42P06, 42P07) and must be retried in a new transaction, which
// Migrate does itself.
func (s *Store) MigrateTx(ctx context.Context, tx pgx.Tx) error {
	return migrate.UpTx(ctx, tx, s.names)
}

// Version returns the highest applied migration (0 when none, including
// when the schema does not exist). Migrate brings it to the latest version;
// a health check can compare the two (framework/observe's Health does).
func (s *Store) Version(ctx context.Context) (int, error) {
	return migrate.Version(ctx, s.pool, s.names)
}
