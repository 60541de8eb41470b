package middleware_test

import (
	"context"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/internal/testenv"
	"github.com/claimtx/claimtx/middleware"
)

// TestClaimKey: a handler reads the key its message was claimed under
// (framework.ClaimKey), the one its claim row stores, whether the claim is
// per message, hashed by the KeyPolicy, or a batch's; there is none
// outside the middleware and in ModeNaturalKey without a Key.
func TestClaimKey(t *testing.T) {
	t.Parallel()
	b := setup(t, 2)
	storedKey := func(consumer string) string {
		var k string
		require.NoError(t, b.pool.QueryRow(t.Context(), "SELECT message_key FROM "+b.table("processed_messages")+" WHERE consumer = $1", consumer).Scan(&k))
		return k
	}
	var seen []string
	var found bool
	record := func(ctx context.Context, tx pgx.Tx, msg *message.Message) error {
		var k string
		k, found = framework.ClaimKey(ctx)
		seen = append(seen, k)
		return credit(ctx, tx, msg)
	}
	o := order{OrderID: 7, CustomerID: 1, TotalCents: 100}

	c := b.claim(t, "loyalty", nil)
	_, err := testenv.Install(t, middleware.NewClaim, c)(consume(record))(newDelivery(t, o))
	require.NoError(t, err)
	require.True(t, found)
	require.Equal(t, []string{"order-completed:7"}, seen)
	require.Equal(t, storedKey("loyalty"), seen[0])

	c.Consumer, c.KeyPolicy = "hashed", framework.KeyPolicy{MaxBytes: 8, HashOverlong: true}
	_, err = testenv.Install(t, middleware.NewClaim, c)(consume(record))(newDelivery(t, o))
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(seen[1], "sha256:"), seen[1])
	require.Equal(t, storedKey("hashed"), seen[1])

	natural := middleware.Claim{Store: b.store, Consumer: "natural", Mode: middleware.ModeNaturalKey}
	_, err = testenv.Install(t, middleware.NewClaim, natural)(consume(record))(newDelivery(t, o))
	require.NoError(t, err)
	require.False(t, found, "a natural-key claim without a Key has no key")

	_, ok := framework.ClaimKey(t.Context())
	require.False(t, ok, "outside the middleware")

	c = b.claim(t, "batch", nil)
	batch, err := middleware.NewBatch(c)
	require.NoError(t, err)
	msgs := []*message.Message{newDelivery(t, order{OrderID: 8, CustomerID: 1}), newDelivery(t, order{OrderID: 9, CustomerID: 1})}
	var inBatch []string
	for _, err := range batch.Process(t.Context(), msgs, func(ctx context.Context, tx pgx.Tx, msgs []*message.Message) error {
		for _, m := range msgs {
			k, _ := framework.ClaimKey(m.Context())
			inBatch = append(inBatch, k)
		}
		return creditSet(ctx, tx, msgs)
	}) {
		require.NoError(t, err)
	}
	require.ElementsMatch(t, []string{"order-completed:8", "order-completed:9"}, inBatch)
}
