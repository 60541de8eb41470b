package middleware

import (
	"context"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/claimtx/claimtx/framework"
)

// TxHandlerFunc is a handler written against the claim transaction: every
// effect it makes through tx commits or rolls back with the claim.
type TxHandlerFunc func(ctx context.Context, tx pgx.Tx, msg *message.Message) error

// TxHandler adapts fn to a Watermill consumer handler under the claim
// middleware. Outside it, it fails with framework.ErrNoClaimTx (permanent)
// instead of writing without a claim.
func TxHandler(fn TxHandlerFunc) message.NoPublishHandlerFunc {
	return func(msg *message.Message) error {
		tx, ok := framework.TxFromContext(msg.Context())
		if !ok {
			return framework.Permanent(framework.ErrNoClaimTx)
		}
		return fn(msg.Context(), tx, msg)
	}
}
