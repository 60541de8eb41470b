// Package txctx carries the claim transaction in a context. The claim
// middleware puts it there; framework.TxFromContext, the only way users read
// it, takes it out. Both sides share this one key.
package txctx

import (
	"context"

	"github.com/jackc/pgx/v5"
)

type key struct{}

// With returns a context carrying tx.
func With(ctx context.Context, tx pgx.Tx) context.Context {
	return context.WithValue(ctx, key{}, tx)
}

// From returns the transaction With stored in ctx, and whether there is one.
func From(ctx context.Context) (pgx.Tx, bool) {
	tx, ok := ctx.Value(key{}).(pgx.Tx)
	return tx, ok && tx != nil
}
