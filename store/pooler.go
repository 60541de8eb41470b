package store

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/internal/pg"
)

// ErrTransactionPooler is wrapped by the configuration errors of what
// cannot work when the pool reaches PostgreSQL through a transaction (or
// statement) pooler, such as PgBouncer with pool_mode=transaction: a pool
// using pgx's statement cache (Migrate refuses it) and the outbox relay's
// LISTEN (its Run refuses it). Match it with errors.Is.
var ErrTransactionPooler = errors.New("claimtx: the pool reaches PostgreSQL through a transaction pooler (PgBouncer pool_mode=transaction?)")

// pooler remembers the answer of the probe, which takes three connections'
// worth of round trips: a Store asks once.
type pooler struct {
	mu     sync.Mutex
	known  bool
	pooled bool
}

// BehindTransactionPooler reports whether the Store's pool reaches
// PostgreSQL through a transaction (or statement) pooler, where a server
// connection serves a client for one transaction only: session state
// (LISTEN, session advisory locks, named prepared statements, SET) does
// not survive from one transaction to the next. Migrate asks it first;
// the answer is remembered for the Store.
//
// It compares server process ids: on one pooled connection, twice, then
// on a second, dedicated connection (opened with the pool's
// configuration, outside it) holding a transaction, then on the first one
// again. A direct connection or a pooler in session mode keeps the first
// connection on one server process that the second never shares; a
// transaction pooler moves the first one, or lends its server to the
// second. With PgBouncer's default LIFO reuse of idle servers the answer
// is certain; with server_round_robin=1 too, as long as the pooler's idle
// servers are not being taken by other clients between the probe's
// statements. Under such load a transaction pooler can pass for a session
// one, and what needs a session then fails later instead of at start-up.
func (s *Store) BehindTransactionPooler(ctx context.Context) (bool, error) {
	s.pooler.mu.Lock()
	defer s.pooler.mu.Unlock()
	if s.pooler.known {
		return s.pooler.pooled, nil
	}
	pooled, err := probePooler(ctx, s.pool)
	if err != nil {
		return false, err
	}
	s.pooler.known, s.pooler.pooled = true, pooled
	return pooled, nil
}

// checkPooler refuses a pool whose query mode needs a session when the
// pool has none to give.
func (s *Store) checkPooler(ctx context.Context) error {
	pooled, err := s.BehindTransactionPooler(ctx)
	if err != nil {
		return err
	}
	if pooled && pg.UnsafeBehindPooler(s.pool.Config().ConnConfig.DefaultQueryExecMode) {
		return &framework.ConfigError{Field: "Pool", Reason: pg.PoolerReason, Err: probeFound{}}
	}
	return nil
}

// probeFound is ErrTransactionPooler as the probe reports it, saying how
// it was found rather than repeating the reason.
type probeFound struct{}

func (probeFound) Error() string {
	return "found by claimtx's start-up probe (Store.BehindTransactionPooler)"
}
func (probeFound) Is(target error) bool { return target == ErrTransactionPooler }

// probePooler is BehindTransactionPooler's probe. Every statement runs in
// the simple protocol, so the probe cannot itself trip over the pooler it
// looks for (pgx's default mode prepares statements).
func probePooler(ctx context.Context, pool *pgxpool.Pool) (bool, error) {
	simple := pgx.QueryExecModeSimpleProtocol
	pid := func(q interface {
		QueryRow(context.Context, string, ...any) pgx.Row
	}) (int32, error) {
		var p int32
		err := q.QueryRow(ctx, "SELECT pg_backend_pid()", simple).Scan(&p)
		return p, err
	}
	a, err := pool.Acquire(ctx)
	if err != nil {
		return false, fmt.Errorf("claimtx: probe for a transaction pooler: %w", err)
	}
	defer a.Release()
	var seen [3]int32
	for i := range 2 {
		if seen[i], err = pid(a); err != nil {
			return false, fmt.Errorf("claimtx: probe for a transaction pooler: %w", err)
		}
	}
	// Outside the pool, so a pool of MaxConns 1 cannot wait for itself.
	b, err := pgx.ConnectConfig(ctx, pool.Config().ConnConfig.Copy())
	if err != nil {
		return false, fmt.Errorf("claimtx: probe for a transaction pooler: second connection: %w", err)
	}
	defer func() {
		// Rolled back first, so the pooler can lend that server again
		// rather than close it.
		cctx := context.WithoutCancel(ctx)
		_, _ = b.Exec(cctx, "ROLLBACK", simple)
		_ = b.Close(cctx)
	}()
	if _, err := b.Exec(ctx, "BEGIN", simple); err != nil {
		return false, fmt.Errorf("claimtx: probe for a transaction pooler: second connection: %w", err)
	}
	held, err := pid(b)
	if err != nil {
		return false, fmt.Errorf("claimtx: probe for a transaction pooler: second connection: %w", err)
	}
	if seen[2], err = pid(a); err != nil {
		return false, fmt.Errorf("claimtx: probe for a transaction pooler: %w", err)
	}
	return seen[0] != seen[1] || seen[1] != seen[2] || held == seen[1], nil
}
