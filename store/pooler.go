package store

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/claimtx/claimtx/internal/pg"
)

// ErrTransactionPooler is wrapped by the configuration errors of what
// cannot work through a transaction (or statement) pooler such as
// PgBouncer with pool_mode=transaction: pgx's statement cache (Migrate
// refuses it) and the outbox relay's LISTEN (Run refuses it).
var ErrTransactionPooler = errors.New("claimtx: the pool reaches PostgreSQL through a transaction pooler (PgBouncer pool_mode=transaction?)")

// BehindTransactionPooler reports whether the Store's pool reaches
// PostgreSQL through a transaction (or statement) pooler, where session
// state (LISTEN, advisory locks, prepared statements, SET) does not
// survive between transactions. Migrate asks it first; the answer is
// remembered.
//
// It compares server process ids of a pooled connection before and after
// a second, dedicated connection holds a transaction: a transaction pooler
// moves the first, or lends its server to the second. One round is certain
// with PgBouncer's LIFO reuse of idle servers; with server_round_robin=1
// or busy neighbours one can miss, five rarely do.
func (s *Store) BehindTransactionPooler(ctx context.Context) (bool, error) {
	s.poolerMu.Lock()
	defer s.poolerMu.Unlock()
	if s.pooled != nil {
		return *s.pooled, nil
	}
	pooled, err := probePooler(ctx, s.pool)
	if err != nil {
		return false, err
	}
	s.pooled = &pooled
	return pooled, nil
}

// probeFound is ErrTransactionPooler as the probe reports it.
type probeFound struct{}

func (probeFound) Error() string {
	return "found by claimtx's start-up probe (Store.BehindTransactionPooler)"
}
func (probeFound) Is(target error) bool { return target == ErrTransactionPooler }

// probePooler is BehindTransactionPooler's probe, tried again while it is
// starved.
func probePooler(ctx context.Context, pool *pgxpool.Pool) (bool, error) {
	for attempt := 1; ; attempt++ {
		pooled, err := probeOnce(ctx, pool)
		if !errors.Is(err, errProbeStarved) {
			return pooled, err
		}
		if attempt == probeAttempts {
			// Each time the first connection waited while the second held
			// a transaction: only a pooler out of servers makes it wait.
			return true, nil
		}
		// Replicas probing together starve each other of servers: apart,
		// at random, they do not.
		if err := pg.Sleep(ctx, time.Duration(50+rand.IntN(450))*time.Millisecond); err != nil {
			return false, fmt.Errorf("claimtx: probe for a transaction pooler: %w", err)
		}
	}
}

// A starved probe's first connection waits probeHoldWait for a server
// while the second holds its transaction, probeAttempts times.
const (
	probeAttempts = 4
	probeHoldWait = time.Second
	probeRounds   = 5
)

var errProbeStarved = errors.New("claimtx: probe for a transaction pooler: starved")

// probeOnce is one probe of probeRounds rounds on the same two
// connections. Every statement runs in the simple protocol, so the probe
// cannot itself trip over the pooler it looks for.
func probeOnce(ctx context.Context, pool *pgxpool.Pool) (bool, error) {
	simple := pgx.QueryExecModeSimpleProtocol
	pid := func(ctx context.Context, q pg.Querier) (int32, error) {
		var p int32
		err := q.QueryRow(ctx, "SELECT pg_backend_pid()", simple).Scan(&p)
		return p, err
	}
	fail := func(what string, err error) (bool, error) {
		return false, fmt.Errorf("claimtx: probe for a transaction pooler: %s%w", what, err)
	}
	a, err := pool.Acquire(ctx)
	if err != nil {
		return fail("", err)
	}
	defer a.Release()
	base, err := pid(ctx, a)
	if err != nil {
		return fail("", err)
	}
	// Outside the pool, so a pool of MaxConns 1 cannot wait for itself.
	b, err := pgx.ConnectConfig(ctx, pool.Config().ConnConfig.Copy())
	if err != nil {
		return fail("second connection: ", err)
	}
	defer func() { _ = b.Close(context.WithoutCancel(ctx)) }()
	for range probeRounds {
		if p, err := pid(ctx, a); err != nil || p != base {
			if err != nil {
				return fail("", err)
			}
			return true, nil
		}
		if _, err := b.Exec(ctx, "BEGIN", simple); err != nil {
			return fail("second connection: ", err)
		}
		held, err := pid(ctx, b)
		if err != nil {
			return fail("second connection: ", err)
		}
		if held == base {
			return true, nil // the second connection was lent the first one's server
		}
		wctx, cancel := context.WithTimeout(ctx, probeHoldWait)
		p, err := pid(wctx, a)
		starved := err != nil && ctx.Err() == nil && wctx.Err() != nil
		cancel()
		if starved {
			_ = a.Conn().PgConn().Close(context.WithoutCancel(ctx)) // a cancelled wait leaves it unusable: the pool drops it
			return false, errProbeStarved
		}
		if err != nil {
			return fail("", err)
		}
		if p != base {
			return true, nil
		}
		// Rolled back, so the pooler can lend that server again.
		if _, err := b.Exec(ctx, "ROLLBACK", simple); err != nil {
			return fail("second connection: ", err)
		}
	}
	return false, nil
}
