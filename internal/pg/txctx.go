package pg

// WithTx and TxFrom carry the claim transaction in a context. The claim
// middleware puts it there; framework.TxFromContext, the only way users read
// it, takes it out. Both sides share this one key.

import (
	"context"

	"github.com/jackc/pgx/v5"
)

type txKey struct{}

// WithTx returns a context carrying tx.
func WithTx(ctx context.Context, tx pgx.Tx) context.Context {
	return context.WithValue(ctx, txKey{}, tx)
}

// TxFrom returns the transaction WithTx stored in ctx, and whether there is one.
func TxFrom(ctx context.Context) (pgx.Tx, bool) {
	tx, ok := ctx.Value(txKey{}).(pgx.Tx)
	return tx, ok && tx != nil
}
