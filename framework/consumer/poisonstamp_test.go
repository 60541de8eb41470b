package consumer_test

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/framework/consumer"
	"github.com/claimtx/claimtx/internal/testenv"
	"github.com/claimtx/claimtx/store"
)

// Both consumers stamp their poisoned copies with the consumer name, the
// claim key (under the claim's key policy, when it could be derived), the
// time and the topic it came from, which `claimtx dlq` lists, classifies
// and replays by. The batch consumer publishes its copies outside a
// Watermill router (the settler), where the topic is not in the message
// context.
func TestPoisonedCopiesAreStamped(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"message", "batch"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			pool, schema := testenv.Setup(t, 4)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			bcfg := goChannel(schema)
			cfg := consumer.Config{
				Name: "stamps", Topic: "orders", Key: "template:order:{payload.order_id}", Pool: pool,
				Store: store.Config{Schema: schema}, Broker: bcfg,
				RetryInitialInterval: time.Millisecond, Logger: slog.New(slog.DiscardHandler),
			}
			type order struct {
				OrderID int64 `json:"order_id"`
				Fail    bool  `json:"fail"`
			}
			check := func(msg *message.Message) error {
				var o order
				if err := json.Unmarshal(msg.Payload, &o); err != nil {
					return framework.Permanent(err)
				}
				if o.Fail {
					return framework.Permanent(errors.New("refused by the handler"))
				}
				return nil
			}
			var run func(context.Context) error
			var closeIt func() error
			if mode == "message" {
				c, err := consumer.New(ctx, cfg, func(_ context.Context, _ pgx.Tx, msg *message.Message) error { return check(msg) })
				require.NoError(t, err)
				run, closeIt = c.Run, c.Close
			} else {
				c, err := consumer.NewBatch(ctx, cfg, func(_ context.Context, _ pgx.Tx, msgs []*message.Message) error {
					for _, m := range msgs {
						if err := check(m); err != nil {
							return err
						}
					}
					return nil
				}, consumer.BatchOptions{MaxSize: 1})
				require.NoError(t, err)
				run, closeIt = c.Run, c.Close
			}
			defer func() { _ = closeIt() }()
			pub, sub := pubSub(t, bcfg)
			poisoned, err := sub.Subscribe(ctx, "orders.poison")
			require.NoError(t, err)

			refused := message.NewMessage(watermill.NewUUID(), []byte(`{"order_id": 7, "fail": true}`))
			refused.Metadata.Set("traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
			require.NoError(t, pub.Publish("orders", refused))
			done := make(chan error, 1)
			go func() { done <- run(ctx) }()

			before := time.Now()
			m := awaitPoisoned(t, poisoned, 30*time.Second, "refused message not poisoned")
			require.Equal(t, refused.UUID, m.UUID)
			require.Equal(t, "stamps", m.Metadata.Get("claimtx_poison_consumer"))
			require.Equal(t, "order:7", m.Metadata.Get("claimtx_poison_key"))
			require.Equal(t, "orders", m.Metadata.Get("topic_poisoned"))
			require.Equal(t, "refused by the handler", m.Metadata.Get("claimtx_poison_reason"))
			require.Equal(t, "true", m.Metadata.Get("claimtx_poison_permanent"))
			require.Equal(t, refused.Metadata.Get("traceparent"), m.Metadata.Get("traceparent"))
			at, err := time.Parse(time.RFC3339Nano, m.Metadata.Get("claimtx_poisoned_at"))
			require.NoError(t, err)
			require.WithinDuration(t, before, at, time.Minute)
			require.Equal(t, time.UTC, at.Location())

			// Unkeyable: stamped without a key.
			require.NoError(t, pub.Publish("orders", message.NewMessage(watermill.NewUUID(), []byte(`{"order_id": `))))
			m = awaitPoisoned(t, poisoned, 30*time.Second, "unkeyable message not poisoned")
			require.Equal(t, "stamps", m.Metadata.Get("claimtx_poison_consumer"))
			_, has := m.Metadata["claimtx_poison_key"]
			require.False(t, has, "no key can be derived")
			require.Equal(t, "orders", m.Metadata.Get("topic_poisoned"))
			require.NotEmpty(t, m.Metadata.Get("claimtx_poisoned_at"))

			cancel()
			require.NoError(t, <-done)
		})
	}
}
