package consumer_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/brokers"
	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/framework/consumer"
	"github.com/claimtx/claimtx/middleware"
	"github.com/claimtx/claimtx/store"
	"github.com/claimtx/claimtx/store/pgtest"
)

// TestRunBatchOverRabbitMQ: batches of up to 50 from 64 subscriptions on a
// real queue, every order published twice, a few undecodable ones: each
// order applied once, the bad ones poisoned, nothing left unacked.
func TestRunBatchOverRabbitMQ(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Setup(t, 8)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st, err := store.New(pool, store.Config{Schema: schema})
	require.NoError(t, err)
	require.NoError(t, st.Migrate(ctx))
	_, err = pool.Exec(ctx, "CREATE TABLE effects (order_id bigint NOT NULL)")
	require.NoError(t, err)

	var b [4]byte
	_, _ = rand.Read(b[:])
	topic := "batch-test-" + hex.EncodeToString(b[:])
	cfg := brokers.DefaultConfig()
	cfg.AMQP.Concurrency = 64
	logger := watermill.NopLogger{}
	sub, err := brokers.NewSubscriber(cfg, logger)
	require.NoError(t, err)
	defer sub.Close()
	pub, err := brokers.NewPublisher(cfg, logger)
	require.NoError(t, err)
	defer pub.Close()
	poisonSub, err := brokers.NewSubscriber(brokers.Config{Kind: brokers.KindAMQP, AMQP: cfg.AMQP}, logger)
	require.NoError(t, err)
	defer poisonSub.Close()
	poisoned, err := poisonSub.Subscribe(ctx, topic+".poison")
	require.NoError(t, err)

	key, err := framework.ParseKeySpec("json:order_id")
	require.NoError(t, err)
	rec := &recorder{got: map[framework.Outcome]int{}}
	bt := middleware.Batch{Claim: middleware.Claim{Store: st, Consumer: "batch", Key: key, OnOutcome: rec.on}}
	handler := func(ctx context.Context, tx pgx.Tx, msg *message.Message) error {
		var o struct {
			OrderID int64 `json:"order_id"`
		}
		if err := json.Unmarshal(msg.Payload, &o); err != nil {
			return framework.Permanent(err)
		}
		_, err := tx.Exec(ctx, "INSERT INTO effects VALUES ($1)", o.OrderID)
		return err
	}
	done := make(chan error, 1)
	go func() {
		done <- consumer.RunBatch(ctx, sub, topic, bt, handler, consumer.BatchOptions{
			MaxSize: 50, Workers: 2, Poison: middleware.Poison{Publisher: pub, Topic: topic + ".poison"},
		})
	}()

	const orders = 300
	var msgs []*message.Message
	for copy := 0; copy < 2; copy++ {
		for i := 1; i <= orders; i++ {
			msgs = append(msgs, message.NewMessage(watermill.NewUUID(), []byte(fmt.Sprintf(`{"order_id": %d}`, i))))
		}
	}
	msgs = append(msgs, message.NewMessage(watermill.NewUUID(), []byte(`{"order_id": `)))
	require.NoError(t, pub.Publish(topic, msgs...))

	select {
	case m := <-poisoned:
		require.Contains(t, m.Metadata.Get(middleware.PoisonReasonKey), "not valid JSON")
		m.Ack()
	case <-time.After(30 * time.Second):
		t.Fatal("bad message not poisoned")
	}
	require.Eventually(t, func() bool {
		return rec.n(framework.Applied) == orders && rec.n(framework.Duplicate) == orders
	}, 60*time.Second, 20*time.Millisecond)
	var n, distinct int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*), count(DISTINCT order_id) FROM effects").Scan(&n, &distinct))
	require.Equal(t, orders, n)
	require.Equal(t, orders, distinct)
	cancel()
	require.NoError(t, <-done)
}
