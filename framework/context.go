package framework

import (
	"context"

	"github.com/jackc/pgx/v5"
)

type txKey struct{}

// WithTx returns a context carrying the claim transaction. The claim
// middleware calls it; handlers read the transaction back with TxFromContext.
func WithTx(ctx context.Context, tx pgx.Tx) context.Context {
	return context.WithValue(ctx, txKey{}, tx)
}

// TxFromContext returns the claim transaction the middleware opened for the
// message being handled. Every write of the handler's effect must go through
// it: a write on another connection would commit even when the claim rolls
// back, which is exactly the gap claimtx closes.
func TxFromContext(ctx context.Context) (pgx.Tx, bool) {
	tx, ok := ctx.Value(txKey{}).(pgx.Tx)
	return tx, ok && tx != nil
}
