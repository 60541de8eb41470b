package store

import (
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/internal/pg"
	"github.com/claimtx/claimtx/store/internal/claimsql"
	"github.com/claimtx/claimtx/store/internal/outboxsql"
	"github.com/claimtx/claimtx/store/internal/parksql"
)

// Store is claimtx's Postgres layer. It is safe for concurrent use.
type Store struct {
	pool  *pgxpool.Pool
	cfg   Config
	names *pg.Names

	claims    *claimsql.Statements
	positions *claimsql.PositionStatements
	outbox    *outboxsql.Statements
	parking   *parksql.Statements

	poolerMu sync.Mutex
	pooled   *bool         // BehindTransactionPooler's answer, nil until known
	leaseTTL time.Duration // leaseTTL; tests shorten it
}

// New validates cfg and returns a Store using pool. It does not touch the
// database: call Migrate before the first claim.
func New(pool *pgxpool.Pool, cfg Config) (*Store, error) {
	if pool == nil {
		return nil, &framework.ConfigError{Field: "Pool", Reason: "must not be nil"}
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	s := &Store{
		pool:      pool,
		cfg:       cfg,
		names:     pg.NewNames(cfg.Schema, cfg.ClaimsTable, cfg.OutboxTable),
		claims:    claimsql.For(cfg.Schema, cfg.ClaimsTable),
		positions: claimsql.PositionsFor(cfg.Schema),
		outbox:    outboxsql.For(cfg.Schema, cfg.OutboxTable),
		leaseTTL:  leaseTTL,
	}
	s.claims.Pool, s.positions.Pool = pool, pool
	s.parking = parksql.For(pool, s.names)
	return s, nil
}

// Pool returns the pool the Store was built with.
func (s *Store) Pool() *pgxpool.Pool { return s.pool }

// Config returns the effective configuration (defaults applied).
func (s *Store) Config() Config { return s.cfg }
