package middleware_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/middleware"
)

// TestCommitThenLostAck runs the middleware in a real Watermill router. The
// first delivery commits, then its ack is lost (an outer middleware turns
// the success into an error, as a crash or network blip between commit and
// ack would): the broker redelivers, and the redelivery is a duplicate.
func TestCommitThenLostAck(t *testing.T) {
	t.Parallel()
	b := setup(t, 4)
	rec := &outcomes{}
	claim := b.claim(t, "loyalty", rec)

	logger := watermill.NopLogger{}
	pubsub := gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: 16}, logger)
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 5 * time.Second}, logger)
	require.NoError(t, err)

	var lost atomic.Bool
	loseFirstAck := func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			out, err := h(msg)
			if err == nil && lost.CompareAndSwap(false, true) {
				return nil, errors.New("ack lost after commit")
			}
			return out, err
		}
	}
	// Watermill runs middleware in the order added, router- and
	// handler-level alike: the ack is lost outside the claim.
	router.AddMiddleware(loseFirstAck)
	// The README's idiom: a typed handler, the claim as handler middleware.
	h := router.AddConsumerHandler("loyalty", "orders", pubsub, middleware.TxHandler(credit))
	h.AddMiddleware(install(t, middleware.NewClaim, claim))

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- router.Run(ctx) }()
	<-router.Running()

	require.NoError(t, pubsub.Publish("orders", newDelivery(t, order{OrderID: 42, CustomerID: 4, TotalCents: 4200})))
	require.Eventually(t, func() bool { return rec.count(framework.Duplicate) == 1 }, 10*time.Second, 5*time.Millisecond)
	cancel()
	require.NoError(t, <-done)
	require.NoError(t, pubsub.Close())

	require.Equal(t, 1, rec.count(framework.Applied))
	require.Equal(t, int64(42), b.balance(t, 4))
	require.Equal(t, int64(1), b.ledgerRows(t, 42))
}
