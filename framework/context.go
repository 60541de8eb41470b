package framework

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/claimtx/claimtx/internal/pg"
)

// TxFromContext returns the claim transaction of the message being handled.
// Every write of the effect must go through it: a write on another
// connection would commit even when the claim rolls back.
func TxFromContext(ctx context.Context) (pgx.Tx, bool) {
	return pg.TxFrom(ctx)
}

// ClaimKey returns the key the message being handled was claimed under,
// after the KeyPolicy (the key `claimtx explain --key` looks up); false
// outside the middleware and in ModeNaturalKey without a Key. Pass the
// message's context (in a batch's set handler, each msg.Context()).
func ClaimKey(ctx context.Context) (string, bool) {
	return pg.KeyFrom(ctx)
}
