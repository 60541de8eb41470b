package consumer_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/claimtx/claimtx/brokers"
	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/framework/consumer"
	"github.com/claimtx/claimtx/internal/pg"
	"github.com/claimtx/claimtx/internal/poison"
	"github.com/claimtx/claimtx/internal/testenv"
	"github.com/claimtx/claimtx/middleware"
)

// memoHandler fails permanently for the orders in bad until fixed is set,
// and counts its runs per order: the memo's point is that it does not run.
type memoHandler struct {
	mu    sync.Mutex
	runs  map[int64]int
	fixed atomic.Bool
}

func (h *memoHandler) apply(ctx context.Context, tx pgx.Tx, msg *message.Message) error {
	var o policyOrder
	if err := json.Unmarshal(msg.Payload, &o); err != nil {
		return framework.Permanent(err)
	}
	h.mu.Lock()
	h.runs[o.OrderID]++
	h.mu.Unlock()
	if o.Do == "permanent" && !h.fixed.Load() {
		return framework.Permanent(fmt.Errorf("order %d refused for good", o.OrderID))
	}
	_, err := tx.Exec(ctx, "INSERT INTO effects (order_id) VALUES ($1)", o.OrderID)
	return err
}

func (h *memoHandler) ran(id int64) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.runs[id]
}

// publishCopy publishes order o with event_id order-<id> as a plain
// producer would, under transport id messageID (AMQP message-id; Kafka has
// none but the offset) and with the header row naming this copy.
func (rb *rawBroker) publishCopy(t *testing.T, o policyOrder, messageID, row string) {
	t.Helper()
	payload := mustJSON(o)
	eventID := fmt.Sprintf("order-%d", o.OrderID)
	switch rb.kind {
	case brokers.KindAMQP:
		rb.publishAMQP(t, amqp091.Publishing{MessageId: messageID, Body: payload, Headers: amqp091.Table{"row": row, "event_id": eventID}})
	default:
		require.NoError(t, rb.kcl.ProduceSync(t.Context(), &kgo.Record{Topic: rb.topic, Value: payload, Headers: []kgo.RecordHeader{
			{Key: "row", Value: []byte(row)}, {Key: "event_id", Value: []byte(eventID)}, {Key: "message_id", Value: []byte(messageID)},
		}}).FirstErr())
	}
}

// poisonReader collects the poison destination's copies by row across
// calls: RabbitMQ hands each copy out once, a Kafka read starts over.
type poisonReader struct {
	rb  *rawBroker
	got map[string]poisonCopy
}

func (p *poisonReader) await(t *testing.T, total int) map[string]poisonCopy {
	t.Helper()
	if p.got == nil {
		p.got = map[string]poisonCopy{}
	}
	if p.rb.kind == brokers.KindAMQP {
		maps.Copy(p.got, p.rb.poisoned(t, total-len(p.got)))
	} else {
		p.got = p.rb.poisoned(t, total)
	}
	require.Len(t, p.got, total, "poisoned copies: %v", p.got)
	return p.got
}

func memoOf(t *testing.T, pool *pgxpool.Pool, schema, consumerName string, id int64) (pg.Memo, bool) {
	t.Helper()
	m, ok, err := pg.MemosOf(pool, pg.NewNames(schema, "processed_messages", "outbox")).Get(t.Context(), consumerName, fmt.Sprintf("order-%d", id))
	require.NoError(t, err)
	return m, ok
}

// memoConfig is the memo tests' consumer: poison memo on, one handler
// retry.
func memoConfig(topic string, pool *pgxpool.Pool, schema string, rb *rawBroker) consumer.Config {
	cfg := baseConfig("memo", topic, pool, schema, rb.cfg)
	cfg.Claim.PoisonMemo, cfg.HandlerRetries, cfg.RetryInitialInterval = true, 1, 5*time.Millisecond
	return cfg
}

func effectCount(t *testing.T, pool *pgxpool.Pool, id int64) int {
	t.Helper()
	return queryInt(t, pool, "SELECT count(*) FROM effects WHERE order_id = $1", id)
}

// TestPoisonMemo: an order that fails permanently is poisoned once, by its
// handler; a redelivery (same transport id) and a fresh copy (new one)
// then go straight to the poison destination without the handler running,
// with the memo's reason; after unpoison (and the fix) the next copy runs
// the handler and is applied. Orders without a memo are untouched. On both
// brokers, per message and in batches.
func TestPoisonMemo(t *testing.T) {
	t.Parallel()
	forEachBrokerAndMode(t, testPoisonMemo)
}

func testPoisonMemo(t *testing.T, kind, mode string) {
	pool, schema, topic, rb := effectsFixture(t, kind, "memo-"+mode)
	h := &memoHandler{runs: map[int64]int{}}
	rec := newRecorder()
	cfg := memoConfig(topic, pool, schema, rb)
	cfg.OnOutcome = rec.on
	c := newModeConsumer(t, mode, cfg, h.apply, perMessage(h.apply))
	_, stop := start(c)
	defer func() { require.NoError(t, stop()) }()
	pr := &poisonReader{rb: rb}

	bad, good := policyOrder{OrderID: 1, Do: "permanent"}, policyOrder{OrderID: 2, Do: "ok"}
	rb.publishCopy(t, bad, "transport-1", "first")
	got := pr.await(t, 1)
	require.Contains(t, got["first"].reason, "order 1 refused for good")
	require.NotContains(t, got["first"].reason, poison.HitPrefix)
	require.Eventually(t, func() bool { _, ok := memoOf(t, pool, schema, "memo", 1); return ok }, 10*time.Second, 10*time.Millisecond, "memo recorded")
	m, _ := memoOf(t, pool, schema, "memo", 1)
	require.EqualValues(t, 1, m.Seen)
	require.Contains(t, m.Reason, "order 1 refused for good")
	require.Equal(t, 1, h.ran(1), "a permanent failure runs the handler once")

	// The same message again (a redelivery), a fresh copy under a new
	// transport id, and an order without a memo.
	rb.publishCopy(t, bad, "transport-1", "redelivery")
	rb.publishCopy(t, bad, "transport-2", "fresh copy")
	rb.publishCopy(t, good, "transport-3", "good")
	got = pr.await(t, 3)
	for _, row := range []string{"redelivery", "fresh copy"} {
		require.Contains(t, got[row].reason, poison.HitPrefix+"order 1 refused for good", row)
		require.NotContains(t, got[row].reason, poison.HitPrefix+poison.HitPrefix, "%s: the reason is the first one, not nested", row)
	}
	require.Eventually(t, func() bool { return effectCount(t, pool, 2) == 1 }, 30*time.Second, 10*time.Millisecond, "the good order applied")
	require.Eventually(t, func() bool { m, _ := memoOf(t, pool, schema, "memo", 1); return m.Seen == 3 }, 10*time.Second, 10*time.Millisecond, "memo counts the copies")
	require.Equal(t, 1, h.ran(1), "memoised copies must not run the handler")
	m, _ = memoOf(t, pool, schema, "memo", 1)
	require.Contains(t, m.Reason, "order 1 refused for good", "a memo hit keeps the memo's reason")
	require.Eventually(t, func() bool { return rec.n(framework.Poisoned) == 3 }, 10*time.Second, 10*time.Millisecond, "outcomes")

	// Unpoison (what `claimtx unpoison` runs), deploy the fix: the next
	// copy runs the handler and is applied.
	n, err := pg.MemosOf(pool, pg.NewNames(schema, "processed_messages", "outbox")).Clear(t.Context(), pg.MemoFilter{Consumer: "memo", Keys: []string{"order-1"}})
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	h.fixed.Store(true)
	rb.publishCopy(t, bad, "transport-4", "after unpoison")
	require.Eventually(t, func() bool { return effectCount(t, pool, 1) == 1 }, 30*time.Second, 10*time.Millisecond, "applied after unpoison")
	require.Equal(t, 2, h.ran(1))
	require.Equal(t, 3, rb.poisonCount(t)+map[bool]int{true: len(pr.got)}[kind == brokers.KindAMQP], "nothing more was poisoned")
	require.Equal(t, 3, rec.n(framework.Poisoned))
	require.Equal(t, 2, rec.n(framework.Applied))
	require.Zero(t, rec.n(framework.Failed))
}

// TestPoisonMemoWriteFailureLosesNothing simulates the crash window
// between the poisoned copy's publish and the memo write with a memo table
// that refuses writes: the message is poisoned all the same (acked, its
// copy in the poison destination), the failure is counted, and the next
// copy runs the handler again and is poisoned again, as without a memo.
// Once the table accepts writes, memos work again.
func TestPoisonMemoWriteFailureLosesNothing(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"message", "batch"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			testPoisonMemoWriteFailure(t, brokers.KindAMQP, mode)
		})
	}
}

func testPoisonMemoWriteFailure(t *testing.T, kind, mode string) {
	pool, schema, topic, rb := effectsFixture(t, kind, "memofail-"+mode)
	h := &memoHandler{runs: map[int64]int{}}
	reg := prometheus.NewRegistry()
	cfg := memoConfig(topic, pool, schema, rb)
	cfg.Registerer = reg
	c := newModeConsumer(t, mode, cfg, h.apply, perMessage(h.apply))
	memo := pgx.Identifier{schema, "processed_messages_poison_memo"}.Sanitize()
	_, err := pool.Exec(t.Context(), `CREATE FUNCTION `+pgx.Identifier{schema, "refuse"}.Sanitize()+`() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN RAISE EXCEPTION 'memo writes refused by the test'; END $$;
CREATE TRIGGER refuse BEFORE INSERT OR UPDATE ON `+memo+` FOR EACH ROW EXECUTE FUNCTION `+pgx.Identifier{schema, "refuse"}.Sanitize()+`()`)
	require.NoError(t, err)
	_, stop := start(c)
	defer func() { require.NoError(t, stop()) }()
	pr := &poisonReader{rb: rb}
	errorsTotal := func() float64 {
		return testenv.MetricSum(t, reg, "claimtx_poison_memo_errors_total")
	}

	bad := policyOrder{OrderID: 1, Do: "permanent"}
	rb.publishCopy(t, bad, "transport-1", "first")
	pr.await(t, 1)
	require.Eventually(t, func() bool { return errorsTotal() == 1 }, 10*time.Second, 10*time.Millisecond, "the failed memo write is counted")
	_, ok := memoOf(t, pool, schema, "memo", 1)
	require.False(t, ok)
	// The crash window: no memo, so the next copy runs the handler again
	// and is poisoned again. Nothing is lost either way.
	rb.publishCopy(t, bad, "transport-2", "second")
	got := pr.await(t, 2)
	require.NotContains(t, got["second"].reason, poison.HitPrefix)
	require.Equal(t, 2, h.ran(1))
	require.Eventually(t, func() bool { return errorsTotal() == 2 }, 10*time.Second, 10*time.Millisecond)

	_, err = pool.Exec(t.Context(), "DROP TRIGGER refuse ON "+memo)
	require.NoError(t, err)
	rb.publishCopy(t, bad, "transport-3", "third")
	pr.await(t, 3)
	require.Eventually(t, func() bool { _, ok := memoOf(t, pool, schema, "memo", 1); return ok }, 10*time.Second, 10*time.Millisecond, "memo recorded")
	rb.publishCopy(t, bad, "transport-4", "fourth")
	got = pr.await(t, 4)
	require.Contains(t, got["fourth"].reason, poison.HitPrefix)
	require.Equal(t, 3, h.ran(1))
	require.EqualValues(t, 2, errorsTotal())
	// Acked, every one: nothing comes back to the handler.
	require.Eventually(t, func() bool { return rb.queueDepth(t, topic) == 0 }, 10*time.Second, 10*time.Millisecond)
}

// PoisonMemo in natural-key mode is refused before anything connects.
func TestPoisonMemoRefusedForNaturalKey(t *testing.T) {
	t.Parallel()
	_, err := consumer.New(t.Context(), consumer.Config{
		Name: "memo", Topic: "memo-natural", DatabaseURL: "postgres://nobody@127.0.0.1:1/none",
		Claim: middleware.Claim{Mode: middleware.ModeNaturalKey, PoisonMemo: true},
	}, noop)
	requireConfigError(t, err, "Claim.PoisonMemo")
}

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
			cfg := baseConfig("stamps", "orders", pool, schema, bcfg)
			cfg.Key, cfg.RetryInitialInterval = "template:order:{payload.order_id}", time.Millisecond
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
			pub, poisoned := pubPoisoned(t, ctx, bcfg, "orders")

			refused := testenv.Message(`{"order_id": 7, "fail": true}`, "traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
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
			require.NoError(t, pub.Publish("orders", testenv.Message(`{"order_id": `)))
			m = awaitPoisoned(t, poisoned, 30*time.Second, "unkeyable message not poisoned")
			require.Equal(t, "stamps", m.Metadata.Get("claimtx_poison_consumer"))
			_, has := m.Metadata["claimtx_poison_key"]
			require.False(t, has, "no key can be derived")
			require.Equal(t, "orders", m.Metadata.Get("topic_poisoned"))
			require.NotEmpty(t, m.Metadata.Get("claimtx_poisoned_at"))

			stopConsumer(t, cancel, done)
		})
	}
}
