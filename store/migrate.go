package store

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/internal/pg"
	"github.com/claimtx/claimtx/store/internal/migrate"
)

// SchemaVersion is the schema version this build migrates to: Version
// reports it once Migrate has run. A readiness check compares the two.
const SchemaVersion = 9

// Migrate brings the schema to the latest version this build knows. It is
// idempotent and safe from several processes starting at once (a
// transaction advisory lock per schema, so it works behind a transaction
// pooler too); an up-to-date schema is recognised with reads only, so a
// role without CREATE can call it at every start-up. Behind a transaction
// pooler (BehindTransactionPooler) it refuses pgx's statement-caching
// query modes with a *framework.ConfigError for Field "Pool" wrapping
// ErrTransactionPooler (docs/operations.md, "Behind PgBouncer").
func (s *Store) Migrate(ctx context.Context) error {
	pooled, err := s.BehindTransactionPooler(ctx)
	if err != nil {
		return err
	}
	if pooled && pg.UnsafeBehindPooler(s.pool.Config().ConnConfig.DefaultQueryExecMode) {
		return &framework.ConfigError{Field: "Pool", Reason: pg.PoolerReason, Err: probeFound{}}
	}
	return migrate.Up(ctx, s.pool, s.names)
}

// MigrateTx is Migrate inside the caller's transaction, for applications
// that run their own migrations with claimtx's. It takes the advisory lock
// as its first statement: make it the first of a fresh transaction too.
// When several processes migrate an empty database at once it can fail
// with SQLSTATE 23505, 42P06 or 42P07 (a catalog looked up before another
// migration committed): retry in a new transaction, as Migrate does.
func (s *Store) MigrateTx(ctx context.Context, tx pgx.Tx) error {
	return migrate.UpTx(ctx, tx, s.names)
}

// Version returns the highest applied migration (0 when none, or no
// schema), for a health check to compare with SchemaVersion.
func (s *Store) Version(ctx context.Context) (int, error) {
	return migrate.Version(ctx, s.pool, s.names)
}
