package consumer_test

import (
	"bytes"
	"context"
	"log/slog"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/framework/consumer"
	"github.com/claimtx/claimtx/internal/testenv"
	"github.com/claimtx/claimtx/store"
)

// A consumer stopped while it is still subscribing (a SIGTERM right after
// start, in a rolling deploy) stops at once and cleanly. Watermill's router
// counts a handler from the moment it is added, so a router closed before
// its handler started waited out its whole close timeout (5 s) and the
// shutdown logged a subscription that "did not close in time".
func TestStopWhileStarting(t *testing.T) {
	t.Parallel()
	forEachBrokerAndMode(t, func(t *testing.T, kind, mode string) {
		pool, schema := testenv.Setup(t, 2)
		topic := "startstop-" + randHex()
		rb := newRawBroker(t, kind, topic)
		var logs bytes.Buffer
		noop := func(context.Context, pgx.Tx, *message.Message) error { return nil }
		c := newModeConsumer(t, mode, consumer.Config{
			Name: "startstop", Topic: topic, Key: "metadata:event_id", Pool: pool,
			Store: store.Config{Schema: schema}, Broker: rb.cfg,
			Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn})),
		}, noop, perMessage(noop))
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		require.NoError(t, c.Run(ctx))
		require.NoError(t, c.Close())
		require.NotContains(t, logs.String(), "did not close in time")
	})
}
