package store

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/claimtx/claimtx/internal/pg"
)

// lease is one run's hold on the retention leadership of a claim table (a
// row of <schema>.claimtx_lease). Every transaction of the run renews it
// (renewTx), failing with ErrNotLeader once another holder has it, so a run
// paused past leaseTTL and taken over changes nothing more; a heartbeat
// renews it between transactions and cancels the run when it is taken.
type lease struct {
	s      *Store
	name   string
	holder string
	ttl    time.Duration

	conn   *pgxpool.Conn   // the run's, returned by release
	ctx    context.Context // the run's, cancelled when the lease is lost
	cancel context.CancelCauseFunc
	stop   context.CancelFunc // ends the heartbeat
	done   chan struct{}      // closed when the heartbeat has ended
	once   sync.Once
}

// leaseName is shared by Cleanup, partition maintenance and the
// partitioning conversion: at most one of them runs against a table.
func (s *Store) leaseName() string { return "retention:" + s.cfg.ClaimsTable }

// newHolder names a run: host and pid for an operator reading the table,
// random bytes so two runs of one process never pass for each other.
func newHolder() string {
	var b [8]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24)
	host, _ := os.Hostname()
	return fmt.Sprintf("%s/%d/%s", host, os.Getpid(), hex.EncodeToString(b[:]))
}

// acquireLease takes the retention lease if it is free, expired (database
// clock) or already this holder's (a retry whose reply was lost), and
// starts its heartbeat; ErrNotLeader when another holder has it. The
// returned context is cancelled with cause ErrNotLeader when it is lost.
func (s *Store) acquireLease(ctx context.Context) (context.Context, *lease, error) {
	l := &lease{s: s, name: s.leaseName(), holder: newHolder(), ttl: s.leaseTTL}
	var got string
	err := s.pool.QueryRow(ctx, s.names.Render(`INSERT INTO {schema}.claimtx_lease AS l (name, holder, expires_at)
VALUES ($1, $2, now() + $3 * interval '1 microsecond')
ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, expires_at = excluded.expires_at
WHERE l.expires_at < now() OR l.holder = excluded.holder
RETURNING holder`), l.name, l.holder, l.ttl.Microseconds()).Scan(&got)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return ctx, nil, ErrNotLeader
	case pg.SQLState(err) == "42P01": // undefined_table
		// An unmigrated schema has no claim table either: say that; one
		// older than migration 8 needs Migrate.
		if _, kerr := s.claimTableKind(ctx, s.pool); kerr != nil {
			return ctx, nil, kerr
		}
		return ctx, nil, fmt.Errorf("claimtx: retention lease: the schema predates the lease table (version %d): run Migrate first: %w", leaseVersion-1, err)
	case pg.SQLState(err) == "42501": // insufficient_privilege
		// A cleanup role granted rights before migration 8: name the grant.
		return ctx, nil, fmt.Errorf("claimtx: retention lease: the role needs SELECT, INSERT, UPDATE, DELETE on %s.claimtx_lease (docs/security.md): %w", s.cfg.Schema, err)
	case err != nil:
		return ctx, nil, fmt.Errorf("claimtx: retention lease: %w", err)
	}
	l.ctx, l.cancel = context.WithCancelCause(ctx)
	var hctx context.Context
	hctx, l.stop = context.WithCancel(l.ctx)
	l.done = make(chan struct{})
	go l.heartbeat(hctx)
	return l.ctx, l, nil
}

// renewSQL extends the lease if this holder still has it, returning a row
// only then. In a transaction it also locks the lease row until commit, so
// a competitor's take-over waits for the transaction and then finds the
// lease renewed: the transaction's work and the lease's validity commit
// together.
const renewSQL = `UPDATE {schema}.claimtx_lease SET expires_at = now() + $3 * interval '1 microsecond'
WHERE name = $1 AND holder = $2 RETURNING true`

// renewTx renews the lease as the first statement of tx, returning
// ErrNotLeader when another holder took it. A nil lease (a dry run's)
// renews nothing.
func (l *lease) renewTx(ctx context.Context, q pg.Querier) error {
	if l == nil {
		return nil
	}
	var ok bool
	err := q.QueryRow(ctx, l.s.names.Render(renewSQL), l.name, l.holder, l.ttl.Microseconds()).Scan(&ok)
	if errors.Is(err, pgx.ErrNoRows) {
		l.lost()
		return ErrNotLeader
	}
	return pg.Wrap(err, "claimtx: renew the retention lease")
}

// renew renews the lease in a transaction of its own.
func (l *lease) renew(ctx context.Context) error {
	if l == nil {
		return nil
	}
	return l.renewTx(ctx, l.s.pool)
}

// execRenewed renews the lease of ctx's run, then runs sql on conn outside
// a transaction (CREATE INDEX CONCURRENTLY, DETACH PARTITION CONCURRENTLY,
// VACUUM), its error wrapped as "claimtx: what: …".
func execRenewed(ctx context.Context, conn *pgxpool.Conn, sql, what string) error {
	if err := leaseOf(ctx).renew(ctx); err != nil {
		return err
	}
	_, err := conn.Exec(ctx, sql)
	return pg.Wrap(err, "claimtx: "+what)
}

// lost ends the run: its context is cancelled with cause ErrNotLeader.
func (l *lease) lost() { l.cancel(ErrNotLeader) }

// heartbeat renews the lease every ttl/3 until release; a failed renewal
// is tried again at the next tick.
func (l *lease) heartbeat(ctx context.Context) {
	defer close(l.done)
	pg.Every(ctx, l.ttl/3, func() bool { return !errors.Is(l.renew(ctx), ErrNotLeader) })
}

// release stops the heartbeat and deletes the lease if it is still this
// holder's, even when ctx is done (an interrupted run must let the next
// one in); a lease it cannot delete expires. When the run failed after
// losing the lease, *errp is made to match ErrNotLeader too.
func (l *lease) release(errp *error) {
	l.once.Do(func() {
		// The connection first: on a pool of one connection the
		// heartbeat may be waiting for it.
		if l.conn != nil {
			l.conn.Release()
		}
		l.stop()
		<-l.done
		if *errp != nil && errors.Is(context.Cause(l.ctx), ErrNotLeader) && !errors.Is(*errp, ErrNotLeader) {
			*errp = errors.Join(ErrNotLeader, *errp)
		}
		l.cancel(nil)
		rctx, cancel := context.WithTimeout(context.WithoutCancel(l.ctx), releaseTimeout)
		defer cancel()
		_, _ = l.s.pool.Exec(rctx, l.s.names.Render("DELETE FROM {schema}.claimtx_lease WHERE name = $1 AND holder = $2"), l.name, l.holder)
	})
}

const (
	leaseTTL       = 30 * time.Second // a lease outlives its last renewal by this (ErrNotLeader's doc says it)
	leaseVersion   = 8                // the migration that creates claimtx_lease
	releaseTimeout = 5 * time.Second  // bounds deleting a lease at the end of a run
)

type leaseKey struct{}

// leaseOf returns the lease of the retention run ctx belongs to, nil
// outside one (a dry run).
func leaseOf(ctx context.Context) *lease {
	l, _ := ctx.Value(leaseKey{}).(*lease)
	return l
}
