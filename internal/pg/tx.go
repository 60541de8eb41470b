package pg

// This file holds what store and middleware both do to a pgx
// transaction they own, so the two cannot drift apart.

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Unlock releases the session advisory lock key that conn holds, even
// when ctx is already done (a cancelled run must still unlock), bounded
// by rollbackTimeout. A connection in an unknown state must not go back
// to the pool still holding the lock: when the unlock fails, conn is
// closed, which ends the session, and the server releases the lock.
func Unlock(ctx context.Context, conn *pgxpool.Conn, key int64) {
	uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
	defer cancel()
	if _, err := conn.Exec(uctx, "SELECT pg_advisory_unlock($1)", key); err != nil {
		_ = conn.Conn().Close(uctx)
	}
}

// rollbackTimeout bounds Rollback: long enough for a live server, short
// enough that a dead one does not hold the caller.
const rollbackTimeout = 5 * time.Second

// Rollback ends tx without its changes, even when ctx is already done (a
// shutdown cancelled the message), so the connection goes back to the pool
// clean; the wait is bounded by rollbackTimeout. Its error is dropped: a
// failed rollback closes the connection, which ends the transaction too.
func Rollback(ctx context.Context, tx pgx.Tx) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
	defer cancel()
	_ = tx.Rollback(rctx)
}
