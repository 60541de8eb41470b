package middleware_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/internal/testenv"
	"github.com/claimtx/claimtx/middleware"
	"github.com/claimtx/claimtx/store"
)

func TestRedeliveryAppliesOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, 4)
	rec := &outcomes{}
	h := testenv.Install(t, middleware.NewClaim, b.claim(t, "loyalty", rec))(consume(credit))
	o := order{OrderID: 9912, CustomerID: 7, TotalCents: 5000}

	_, err := h(newDelivery(t, o))
	require.NoError(t, err)
	_, err = h(newDelivery(t, o))
	require.NoError(t, err)

	rec.requireFirst(t, framework.Applied, framework.Duplicate)
	require.Equal(t, int64(50), b.balance(t, 7))
	require.Equal(t, int64(1), b.ledgerRows(t, 9912))
	require.Equal(t, "order-completed:9912", rec.results[0].Key)
}

// concurrentTwins delivers n copies of one message at once, each on its own
// connection, and checks exactly one applied.
func concurrentTwins(t *testing.T, n int, iso pgx.TxIsoLevel) *outcomes {
	b := setup(t, int32(n))
	rec := &outcomes{}
	c := b.claim(t, "loyalty", rec)
	c.Isolation = iso
	deliverTwins(t, b, testenv.Install(t, middleware.NewClaim, c), credit, rec, n)
	return rec
}

func TestConcurrentTwins8(t *testing.T) {
	t.Parallel()
	concurrentTwins(t, 8, pgx.ReadCommitted)
}

// Not parallel: 64 connections is most of a default server's 100.
func TestConcurrentTwins64(t *testing.T) {
	testenv.SkipBehindPooler(t, "64 twins waiting at once need 64 server connections; a transaction pooler gives a test's role its pool size by design")
	concurrentTwins(t, 64, pgx.ReadCommitted)
}

func TestSerializableTwinsRetryTransparently(t *testing.T) {
	t.Parallel()
	rec := concurrentTwins(t, 16, pgx.Serializable)
	// Under SERIALIZABLE some twins must have hit 40001 and been retried;
	// otherwise this test did not exercise what it claims to.
	rec.requireSerializationRetries(t)
}

func TestRollbackHandsOverToWaitingTwin(t *testing.T) {
	t.Parallel()
	b := setup(t, 4)
	rec := &outcomes{}
	c := b.claim(t, "loyalty", rec)
	o := order{OrderID: 9914, CustomerID: 9, TotalCents: 700}

	holding := make(chan struct{})
	release := make(chan struct{})
	var firstCall sync.Once
	errFirst := errors.New("first delivery fails after claiming")
	h := testenv.Install(t, middleware.NewClaim, c)(consume(func(ctx context.Context, tx pgx.Tx, msg *message.Message) error {
		first := false
		firstCall.Do(func() { first = true })
		if err := credit(ctx, tx, msg); err != nil {
			return err
		}
		if first {
			close(holding)
			<-release
			return errFirst
		}
		return nil
	}))

	t1 := make(chan error, 1)
	go func() { _, err := h(newDelivery(t, o)); t1 <- err }()
	<-holding // T1 has claimed and holds the uncommitted key

	t2 := make(chan error, 1)
	go func() { _, err := h(newDelivery(t, o)); t2 <- err }()

	// Prove T2 is really blocked on T1's key: a backend of this test's
	// schema waiting on a lock, seen from outside.
	require.Eventually(t, func() bool {
		return b.scalar(t, `SELECT count(*) FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND query LIKE '%' || $1 || '%'`, b.schema) == 1
	}, 10*time.Second, 5*time.Millisecond)
	select {
	case err := <-t2:
		t.Fatalf("T2 finished while T1 held the key: %v", err)
	default:
	}

	close(release)
	require.ErrorIs(t, <-t1, errFirst)
	require.NoError(t, <-t2)

	require.Equal(t, 1, rec.count(framework.Applied))
	require.Equal(t, 1, rec.count(framework.Failed))
	require.Equal(t, int64(7), b.balance(t, 9))
	require.Equal(t, int64(1), b.ledgerRows(t, 9914))
}

func TestHandlerFailureLeavesNothing(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		fail func() error
	}{
		{"error", func() error { return errors.New("boom") }},
		{"panic", func() error { panic("boom") }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, 2)
			rec := &outcomes{}
			c := b.claim(t, "loyalty", rec)
			o := order{OrderID: 1, CustomerID: 1, TotalCents: 300}
			fail := true
			h := testenv.Install(t, middleware.NewClaim, c)(consume(failAfter(credit, &fail, tc.fail)))

			_, err := h(newDelivery(t, o))
			require.Error(t, err)
			require.False(t, framework.IsPermanent(err), "a plain handler failure is retryable")
			if tc.name == "panic" {
				var pe *framework.PanicError
				require.ErrorAs(t, err, &pe)
			}
			require.Equal(t, int64(0), b.claims(t, "loyalty"), "claim must roll back with the effect")
			require.Equal(t, int64(0), b.ledgerRows(t, 1))

			fail = false
			b.requireRetryApplies(t, h, rec, o)
		})
	}
}

func TestTwoConsumersShareTheTable(t *testing.T) {
	t.Parallel()
	b := setup(t, 4)
	b.exec(t, "CREATE TABLE analytics (order_id bigint NOT NULL)")
	loyalty := testenv.Install(t, middleware.NewClaim, b.claim(t, "loyalty", nil))(consume(credit))
	analytics := testenv.Install(t, middleware.NewClaim, b.claim(t, "analytics", nil))(consume(func(ctx context.Context, tx pgx.Tx, msg *message.Message) error {
		_, err := tx.Exec(ctx, "INSERT INTO analytics VALUES (9912)")
		return err
	}))
	o := order{OrderID: 9912, CustomerID: 7, TotalCents: 5000}
	for i := 0; i < 2; i++ {
		_, err := loyalty(newDelivery(t, o))
		require.NoError(t, err)
		_, err = analytics(newDelivery(t, o))
		require.NoError(t, err)
	}
	require.Equal(t, int64(1), b.claims(t, "loyalty"))
	require.Equal(t, int64(1), b.claims(t, "analytics"))
	require.Equal(t, int64(50), b.balance(t, 7))
	require.Equal(t, int64(1), b.scalar(t, "SELECT count(*) FROM analytics"))
}

func TestClaimWaitTimeoutIsRetried(t *testing.T) {
	t.Parallel()
	b := setup(t, 4)
	rec := &outcomes{}
	c := b.claim(t, "loyalty", rec)
	c.MaxClaimWait = 50 * time.Millisecond
	c.MaxAttempts = 50
	c.InitialBackoff = 20 * time.Millisecond
	c.MaxBackoff = 50 * time.Millisecond
	o := order{OrderID: 77, CustomerID: 3, TotalCents: 900}

	holding := make(chan struct{})
	release := make(chan struct{})
	var once sync.Once
	h := testenv.Install(t, middleware.NewClaim, c)(consume(func(ctx context.Context, tx pgx.Tx, msg *message.Message) error {
		slow := false
		once.Do(func() { slow = true })
		if slow {
			close(holding)
			<-release
		}
		return credit(ctx, tx, msg)
	}))

	t1 := make(chan error, 1)
	go func() { _, err := h(newDelivery(t, o)); t1 <- err }()
	<-holding
	t2 := make(chan error, 1)
	go func() { _, err := h(newDelivery(t, o)); t2 <- err }()

	// Keep the slow twin holding its key until the waiting one has timed
	// out at least once.
	require.Eventually(t, func() bool {
		rec.mu.Lock()
		defer rec.mu.Unlock()
		return len(rec.retries) > 0
	}, 10*time.Second, 5*time.Millisecond)
	close(release)
	require.NoError(t, <-t1)
	require.NoError(t, <-t2)

	rec.mu.Lock()
	require.Equal(t, "claim_wait", rec.retries[0].Cause)
	rec.mu.Unlock()
	require.Equal(t, 1, rec.count(framework.Applied))
	require.Equal(t, 1, rec.count(framework.Duplicate))
	require.Equal(t, int64(9), b.balance(t, 3))
}

func TestClaimWaitGivesUpAfterMaxAttempts(t *testing.T) {
	t.Parallel()
	b := setup(t, 4)
	c := b.claim(t, "loyalty", nil)
	c.MaxClaimWait = 20 * time.Millisecond
	c.MaxAttempts = 2
	o := order{OrderID: 78, CustomerID: 3, TotalCents: 900}

	// Hold the key from outside for the whole test.
	b.holdClaim(t, "loyalty", "order-completed:78")

	_, err := testenv.Install(t, middleware.NewClaim, c)(consume(credit))(newDelivery(t, o))
	requireClaimWait(t, err)
}

func TestInvalidKeyIsPermanent(t *testing.T) {
	t.Parallel()
	b := setup(t, 2)
	rec := &outcomes{}
	called := false
	h := testenv.Install(t, middleware.NewClaim, b.claim(t, "loyalty", rec))(func(*message.Message) ([]*message.Message, error) {
		called = true
		return nil, nil
	})
	msg := newDelivery(t, order{})
	msg.Payload = []byte(`{"customer_id": 1}`)
	_, err := h(msg)
	require.ErrorAs(t, err, new(*framework.KeyError))
	require.True(t, framework.IsPermanent(err))
	require.False(t, called)
	require.Equal(t, framework.Failed, rec.results[0].Outcome)
}

func TestProducedMessagesAreRefusedUntilOutbox(t *testing.T) {
	t.Parallel()
	b := setup(t, 2)
	h := testenv.Install(t, middleware.NewClaim, b.claim(t, "loyalty", nil))(func(msg *message.Message) ([]*message.Message, error) {
		tx, ok := framework.TxFromContext(msg.Context())
		require.True(t, ok)
		if err := credit(msg.Context(), tx, msg); err != nil {
			return nil, err
		}
		return []*message.Message{message.NewMessage("x", nil)}, nil
	})
	_, err := h(newDelivery(t, order{OrderID: 5, CustomerID: 5, TotalCents: 500}))
	require.ErrorIs(t, err, middleware.ErrProducedMessages)
	require.True(t, framework.IsPermanent(err))
	require.Equal(t, int64(0), b.ledgerRows(t, 5), "effect must roll back")
	require.Equal(t, int64(0), b.claims(t, "loyalty"))
}

func TestTxHandlerOutsideMiddleware(t *testing.T) {
	t.Parallel()
	err := middleware.TxHandler(credit)(newDelivery(t, order{OrderID: 1}))
	require.ErrorIs(t, err, framework.ErrNoClaimTx)
	require.True(t, framework.IsPermanent(err))
}

func TestCancelledContextIsNotRetried(t *testing.T) {
	t.Parallel()
	b := setup(t, 2)
	rec := &outcomes{}
	h := testenv.Install(t, middleware.NewClaim, b.claim(t, "loyalty", rec))(consume(credit))
	msg := newDelivery(t, order{OrderID: 6, CustomerID: 6, TotalCents: 100})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	msg.SetContext(ctx)
	_, err := h(msg)
	require.ErrorIs(t, err, context.Canceled)
	require.Equal(t, 1, rec.results[0].Attempts)
}

func TestBadConfiguration(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	good := b.claim(t, "loyalty", nil)
	for _, tc := range []struct {
		field  string
		mutate func(*middleware.Claim)
	}{
		{"Store", func(c *middleware.Claim) { c.Store = nil }},
		{"Consumer", func(c *middleware.Claim) { c.Consumer = "" }},
		{"Consumer", func(c *middleware.Claim) { c.Consumer = "a\x00b" }},
		{"Key", func(c *middleware.Claim) { c.Key = nil }},
		{"MaxAttempts", func(c *middleware.Claim) { c.MaxAttempts = -1 }},
		{"MaxClaimWait", func(c *middleware.Claim) { c.MaxClaimWait = -time.Second }},
		{"Isolation", func(c *middleware.Claim) { c.Isolation = "read uncommitted; drop table x" }},
	} {
		t.Run(tc.field, func(t *testing.T) {
			c := good
			tc.mutate(&c)
			// A bad config cannot be installed: NewClaim refuses it
			// rather than returning a middleware that nacks every
			// message into a hot redelivery loop.
			mw, err := middleware.NewClaim(c)
			var ce *framework.ConfigError
			require.ErrorAs(t, err, &ce)
			require.Equal(t, tc.field, ce.Field)
			require.Contains(t, err.Error(), tc.field)
			require.Nil(t, mw)
		})
	}
	_, err := framework.ParseKeySpec("nosuch:thing")
	var ce *framework.ConfigError
	require.ErrorAs(t, err, &ce)
	require.Equal(t, "key", ce.Field)
	require.Contains(t, err.Error(), `"nosuch"`)
}

func ExampleClaim() {
	// See README.md's quick start for a complete program; this shows the
	// wiring only.
	var st *store.Store // store.New(pool, store.Config{})
	key, _ := framework.ParseKeySpec("template:order-completed:{payload.order_id}")
	claim, err := middleware.NewClaim(middleware.Claim{Store: st, Consumer: "loyalty", Key: key})
	fmt.Println(claim == nil, err)
	// Output: true claimtx: config field "Store": must not be nil
}

func TestFingerprintMismatchDetected(t *testing.T) {
	t.Parallel()
	b := setup(t, 2)
	rec := &outcomes{}
	c := b.claim(t, "loyalty", rec)
	c.Fingerprint = true
	h := testenv.Install(t, middleware.NewClaim, c)(consume(credit))
	o := order{OrderID: 500, CustomerID: 5, TotalCents: 1000}
	for _, cents := range []int64{1000, 1000, 9999} {
		o.TotalCents = cents
		_, err := h(newDelivery(t, o))
		require.NoError(t, err)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	require.Equal(t, framework.Applied, rec.results[0].Outcome)
	require.False(t, rec.results[1].FingerprintMismatch, "an identical redelivery is a plain duplicate")
	require.Equal(t, framework.Duplicate, rec.results[2].Outcome)
	require.True(t, rec.results[2].FingerprintMismatch, "same key, different payload")
	require.Equal(t, int64(10), b.balance(t, 5), "the first payload's effect stands")
}

// TestCommitThenLostAck runs the middleware in a real Watermill router. The
// first delivery commits, then its ack is lost (an outer middleware turns
// the success into an error, as a crash or network blip between commit and
// ack would): the broker redelivers, and the redelivery is a duplicate.
func TestCommitThenLostAck(t *testing.T) {
	t.Parallel()
	b := setup(t, 4)
	rec := &outcomes{}
	claim := b.claim(t, "loyalty", rec)

	pubsub := gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: 16}, nil)
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 5 * time.Second}, nil)
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
	h.AddMiddleware(testenv.Install(t, middleware.NewClaim, claim))

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

// TestModelExactlyOnce drives the middleware with random interleavings of
// deliveries, redeliveries, handler failures and panics, with twins running
// concurrently, and checks the invariant against the simplest model: a
// broker that redelivers every unacked message until it is acked ends with
// every key's effect applied exactly once.
func TestModelExactlyOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, 8)
	ctx := context.Background()
	b.exec(t, "CREATE TABLE effects (consumer text NOT NULL, k text NOT NULL)")
	kf, err := framework.ParseKeySpec("metadata:event_id")
	require.NoError(t, err)

	iteration := 0
	rapid.Check(t, func(rt *rapid.T) {
		iteration++
		consumer := fmt.Sprintf("model-%d", iteration)
		nKeys := rapid.IntRange(1, 6).Draw(rt, "keys")
		c := middleware.Claim{Store: b.store, Consumer: consumer, Key: kf}
		var mu sync.Mutex
		failing := map[string]string{} // key -> "error" | "panic" for its next attempt
		h := testenv.Install(t, middleware.NewClaim, c)(consume(func(ctx context.Context, tx pgx.Tx, msg *message.Message) error {
			k := msg.Metadata.Get("event_id")
			if _, err := tx.Exec(ctx, "INSERT INTO effects VALUES ($1, $2)", consumer, k); err != nil {
				return err
			}
			mu.Lock()
			mode := failing[k]
			delete(failing, k)
			mu.Unlock()
			switch mode {
			case "error":
				return errors.New("injected")
			case "panic":
				panic("injected")
			}
			return nil
		}))
		deliver := func(k string) error {
			msg := testenv.Message("")
			msg.Metadata.Set("event_id", k)
			msg.SetContext(ctx)
			_, err := h(msg)
			return err
		}

		acked := map[string]bool{}
		waves := rapid.IntRange(1, 5).Draw(rt, "waves")
		for w := 0; w < waves; w++ {
			batch := rapid.SliceOfN(rapid.IntRange(0, nKeys-1), 1, 10).Draw(rt, fmt.Sprintf("wave%d", w))
			mu.Lock()
			for _, i := range batch {
				k := fmt.Sprintf("k%d", i)
				switch rapid.IntRange(0, 3).Draw(rt, "fault") {
				case 1:
					failing[k] = "error"
				case 2:
					failing[k] = "panic"
				}
			}
			mu.Unlock()
			results := make([]error, len(batch))
			var wg sync.WaitGroup
			for j, i := range batch {
				wg.Add(1)
				go func() {
					defer wg.Done()
					results[j] = deliver(fmt.Sprintf("k%d", i))
				}()
			}
			wg.Wait()
			for j, i := range batch {
				if results[j] == nil {
					acked[fmt.Sprintf("k%d", i)] = true
				}
			}
		}
		// The broker redelivers whatever was delivered but never acked.
		mu.Lock()
		clear(failing)
		mu.Unlock()
		for i := 0; i < nKeys; i++ {
			k := fmt.Sprintf("k%d", i)
			if !acked[k] {
				if err := deliver(k); err != nil {
					rt.Fatalf("redelivery of %s failed: %v", k, err)
				}
			}
		}
		rows, err := b.pool.Query(ctx, "SELECT k, count(*) FROM effects WHERE consumer = $1 GROUP BY k", consumer)
		if err != nil {
			rt.Fatal(err)
		}
		counts := map[string]int{}
		for rows.Next() {
			var k string
			var n int
			if err := rows.Scan(&k, &n); err != nil {
				rt.Fatal(err)
			}
			counts[k] = n
		}
		if err := rows.Err(); err != nil {
			rt.Fatal(err)
		}
		for i := 0; i < nKeys; i++ {
			k := fmt.Sprintf("k%d", i)
			if counts[k] != 1 {
				rt.Fatalf("key %s applied %d times, want exactly 1", k, counts[k])
			}
		}
	})
}

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
