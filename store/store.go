package store

import (
	"context"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
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

// Claim inserts the claim (consumer, key) in tx and reports whether it was
// new. false means an earlier transaction committed the same claim: the
// caller must not apply the effect. If a concurrent transaction holds the
// same uncommitted claim, Claim blocks until it ends (see ClaimWait to bound
// that wait): on its commit Claim returns false, on its rollback true.
//
// The claim is only durable if tx commits; that is the point.
func (s *Store) Claim(ctx context.Context, tx pgx.Tx, consumer, key string) (bool, error) {
	return s.ClaimWait(ctx, tx, consumer, key, 0)
}

// ClaimWait is Claim with the wait behind a concurrent twin bounded by wait
// (0: unbounded). When the bound is hit, the error classifies as
// CauseClaimWait, and the transaction is aborted: retry with a fresh one.
//
// The lock_timeout is set and reset around the claim in the same round trip
// (a pipelined batch), so the handler's own statements keep the session's
// default lock_timeout. Reset means the default from the server or the
// connection's startup parameters; a lock_timeout changed with SET in
// AfterConnect is not restored.
func (s *Store) ClaimWait(ctx context.Context, tx pgx.Tx, consumer, key string, wait time.Duration) (bool, error) {
	res, err := s.ClaimWith(ctx, tx, ClaimRequest{Consumer: consumer, Key: key, Wait: wait})
	return res.New, err
}
