package framework

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/claimtx/claimtx/internal/pg"
)

// TxFromContext returns the claim transaction the middleware opened for the
// message being handled. Every write of the handler's effect must go through
// it: a write on another connection would commit even when the claim rolls
// back, which is exactly the gap claimtx closes.
func TxFromContext(ctx context.Context) (pgx.Tx, bool) {
	return pg.TxFrom(ctx)
}
