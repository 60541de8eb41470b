// Package ddl is how the examples create their effect tables when several
// replicas start at once, on an empty database too, and a least-privilege
// role must start against tables an operator created.
package ddl

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// CreateOnce runs ddl (CREATE TABLE IF NOT EXISTS statements) unless
// present, a query returning one boolean, says the tables exist.
//
// present is first asked in a statement of its own: a role without CREATE
// must start against tables an operator created, and Postgres checks
// CREATE before IF NOT EXISTS. Otherwise CREATE … IF NOT EXISTS is not
// safe against a concurrent create, so the processes queue on an advisory
// lock named lock. The lock is a session lock taken before the transaction
// that runs ddl begins: Postgres applies other sessions' catalog changes to
// a backend's caches at transaction start, so a transaction begun (or a
// lookup made on the connection) before a predecessor committed could
// still take the tables for missing after the lock. Inside that
// transaction present is asked again, so a process that waited for
// another's create runs no DDL.
func CreateOnce(ctx context.Context, pool *pgxpool.Pool, lock, present, ddl string) error {
	var ok bool
	if err := pool.QueryRow(ctx, present).Scan(&ok); err == nil && ok {
		return nil
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("acquire connection: %w", err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock(hashtext($1))", lock); err != nil {
		// A lock wait interrupted by ctx may still have been granted: a
		// connection in that doubt must not go back to the pool.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		_ = conn.Conn().Close(cctx)
		cancel()
		return fmt.Errorf("advisory lock %q: %w", lock, err)
	}
	defer func() {
		// ctx may be cancelled by now; the lock must still be released.
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if _, err := conn.Exec(uctx, "SELECT pg_advisory_unlock(hashtext($1))", lock); err != nil {
			_ = conn.Conn().Close(uctx) // ending the session releases the lock
		}
	}()
	return pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if err := tx.QueryRow(ctx, present).Scan(&ok); err != nil {
			return fmt.Errorf("check tables: %w", err)
		}
		if ok {
			return nil
		}
		if _, err := tx.Exec(ctx, ddl); err != nil {
			return fmt.Errorf("create tables: %w", err)
		}
		return nil
	})
}
