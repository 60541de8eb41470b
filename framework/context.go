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

// ClaimKey returns the key the claim middleware claimed the message being
// handled under, as its claim stores it (after the KeyPolicy: an over-long
// key it hashed is "sha256:<hex>"), the key `claimtx explain --key` and the
// console look up; false outside the middleware and in ModeNaturalKey
// without a Key. Pass the message's context: the ctx of a TxHandlerFunc,
// or, in a batch's set handler, each message's msg.Context().
func ClaimKey(ctx context.Context) (string, bool) {
	return pg.KeyFrom(ctx)
}
