package pg

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
)

// rollbackTimeout bounds Rollback: long enough for a live server, short
// enough that a dead one does not hold the caller.
const rollbackTimeout = 5 * time.Second

// Rollback ends tx, even when ctx is already done (a shutdown), so the
// connection goes back to the pool clean, within rollbackTimeout. Its
// error is dropped: a failed rollback closes the connection, which ends
// the transaction too.
func Rollback(ctx context.Context, tx pgx.Tx) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
	defer cancel()
	_ = tx.Rollback(rctx)
}
