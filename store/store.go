package store

import (
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/claimtx/claimtx/framework"
)

// Store is claimtx's Postgres layer. It is safe for concurrent use; it holds
// no state besides its configuration and the pool.
type Store struct {
	pool  *pgxpool.Pool
	cfg   Config
	names *strings.Replacer

	claims claimStatements
	outbox outboxSQL
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
	s := &Store{pool: pool, cfg: cfg}
	s.names = strings.NewReplacer(
		"{schema}", ident(cfg.Schema),
		"{claims}", ident(cfg.ClaimsTable),
		"{claims_processed_at_idx}", ident(cfg.ClaimsTable+"_processed_at_idx"),
		"{outbox}", ident(cfg.OutboxTable),
		"{outbox_pending_idx}", ident(cfg.OutboxTable+"_pending_idx"),
		"{outbox_sent_idx}", ident(cfg.OutboxTable+"_sent_idx"),
	)
	s.initOutboxSQL()
	s.initClaimSQL()
	return s, nil
}

// Pool returns the pool the Store was built with.
func (s *Store) Pool() *pgxpool.Pool { return s.pool }

// Config returns the effective configuration (defaults applied).
func (s *Store) Config() Config { return s.cfg }

// MaxConsumerBytes bounds consumer names; they are stored in every claim.
const MaxConsumerBytes = 200
