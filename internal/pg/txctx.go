package pg

import (
	"context"

	"github.com/jackc/pgx/v5"
)

type txKey struct{}

// WithTx returns a context carrying tx, the claim transaction, for
// framework.TxFromContext.
func WithTx(ctx context.Context, tx pgx.Tx) context.Context {
	return context.WithValue(ctx, txKey{}, tx)
}

// TxFrom returns the transaction WithTx stored in ctx, and whether there is one.
func TxFrom(ctx context.Context) (pgx.Tx, bool) {
	tx, ok := ctx.Value(txKey{}).(pgx.Tx)
	return tx, ok && tx != nil
}

type keyKey struct{}

// WithKey returns a context carrying the claimed key, for
// framework.ClaimKey.
func WithKey(ctx context.Context, key string) context.Context {
	return context.WithValue(ctx, keyKey{}, key)
}

// KeyFrom returns the key WithKey stored in ctx, and whether there is one.
func KeyFrom(ctx context.Context) (string, bool) {
	key, _ := ctx.Value(keyKey{}).(string)
	return key, key != ""
}
