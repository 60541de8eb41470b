package middleware_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/middleware"
)

func batchOf(t *testing.T, orders ...order) []*message.Message {
	msgs := make([]*message.Message, len(orders))
	for i, o := range orders {
		msgs[i] = newDelivery(t, o)
	}
	return msgs
}

func (b bundle) batch(t testing.TB, rec *outcomes) *middleware.Batch {
	return newBatch(t, b.claim(t, "loyalty", rec))
}

// batchSetup is setup with a loyalty batch reporting to rec.
func batchSetup(t testing.TB, maxConns int32) (b bundle, rec *outcomes, bt *middleware.Batch) {
	t.Helper()
	b, rec = setup(t, maxConns), &outcomes{}
	return b, rec, b.batch(t, rec)
}

func newBatch(t testing.TB, c middleware.Claim) *middleware.Batch {
	t.Helper()
	bt, err := middleware.NewBatch(c)
	require.NoError(t, err)
	return bt
}

// batchMode runs a batch through a set handler that credits one message
// at a time (credit in a loop) or the whole set in one statement
// (creditSet); check, when set, then runs for each message and may fail
// or panic.
type batchMode struct {
	name string
	run  batchRun
}

// batchRun processes msgs in one batch through bt, the way a batchMode
// says.
type batchRun func(bt *middleware.Batch, ctx context.Context, msgs []*message.Message, check func(*message.Message) error) []error

var batchModes = []batchMode{
	{"per-message", func(bt *middleware.Batch, ctx context.Context, msgs []*message.Message, check func(*message.Message) error) []error {
		return bt.Process(ctx, msgs, func(ctx context.Context, tx pgx.Tx, msgs []*message.Message) error {
			for _, msg := range msgs {
				if err := credit(ctx, tx, msg); err != nil {
					return err
				}
				if check != nil {
					if err := check(msg); err != nil {
						return err
					}
				}
			}
			return nil
		})
	}},
	{"set", func(bt *middleware.Batch, ctx context.Context, msgs []*message.Message, check func(*message.Message) error) []error {
		return bt.Process(ctx, msgs, func(ctx context.Context, tx pgx.Tx, msgs []*message.Message) error {
			if err := creditSet(ctx, tx, msgs); err != nil || check == nil {
				return err
			}
			for _, msg := range msgs {
				if err := check(msg); err != nil {
					return err
				}
			}
			return nil
		})
	}},
}

// forEachBatchMode runs test in parallel subtests, one per batchMode, of
// a parallel test.
func forEachBatchMode(t *testing.T, test func(t *testing.T, run batchRun)) {
	t.Parallel()
	for _, m := range batchModes {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			test(t, m.run)
		})
	}
}

func TestBatchRedeliveryAndInBatchDuplicates(t *testing.T) {
	forEachBatchMode(t, testBatchRedeliveryAndInBatchDuplicates)
}

func testBatchRedeliveryAndInBatchDuplicates(t *testing.T, run batchRun) {
	b, rec, bt := batchSetup(t, 4)
	o1 := order{OrderID: 1, CustomerID: 1, TotalCents: 100}
	o2 := order{OrderID: 2, CustomerID: 1, TotalCents: 200}
	o3 := order{OrderID: 3, CustomerID: 2, TotalCents: 300}

	errs := run(bt, context.Background(), batchOf(t, o1, o2, o1, o3, o2), nil)
	require.Equal(t, []error{nil, nil, nil, nil, nil}, errs)
	require.Equal(t, 3, rec.count(framework.Applied))
	require.Equal(t, 2, rec.count(framework.Duplicate))

	// The whole batch redelivered after a lost ack: all duplicates.
	errs = run(bt, context.Background(), batchOf(t, o3, o2, o1), nil)
	require.Equal(t, []error{nil, nil, nil}, errs)
	require.Equal(t, 3, rec.count(framework.Applied))
	require.Equal(t, 5, rec.count(framework.Duplicate))
	require.Equal(t, int64(3), b.balance(t, 1))
	require.Equal(t, int64(3), b.balance(t, 2))
	for _, id := range []int64{1, 2, 3} {
		require.Equal(t, int64(1), b.ledgerRows(t, id))
	}
}

func TestBatchIsolatesFailingMessages(t *testing.T) {
	forEachBatchMode(t, testBatchIsolatesFailingMessages)
}

func testBatchIsolatesFailingMessages(t *testing.T, run batchRun) {
	b, rec, bt := batchSetup(t, 4)
	var orders []order
	for i := int64(1); i <= 10; i++ {
		orders = append(orders, order{OrderID: i, CustomerID: i % 3, TotalCents: 100 * i})
	}
	boom := errors.New("order 4 is rejected")
	check := func(msg *message.Message) error {
		switch msg.Metadata.Get("event_id") {
		case "evt-4":
			return boom
		case "evt-7":
			panic("order 7 panics")
		}
		return nil
	}
	msgs := batchOf(t, orders...)
	msgs[8].Payload = []byte(`{"no": "order id"}`)
	errs := run(bt, context.Background(), msgs, check)
	for i, err := range errs {
		switch i {
		case 3:
			require.ErrorIs(t, err, boom)
		case 6:
			var pe *framework.PanicError
			require.ErrorAs(t, err, &pe)
		case 8:
			require.ErrorAs(t, err, new(*framework.KeyError))
			require.True(t, framework.IsPermanent(err))
		default:
			require.NoError(t, err, "message %d", i)
		}
	}
	require.Equal(t, 7, rec.count(framework.Applied))
	require.Equal(t, 3, rec.count(framework.Failed))
	require.Equal(t, int64(7), b.claims(t, "loyalty"), "failed messages leave no claim")
	require.Equal(t, int64(0), b.ledgerRows(t, 4))
	require.Equal(t, int64(0), b.ledgerRows(t, 7))

	// Redelivered alone once fixed, they apply.
	errs = run(bt, context.Background(), batchOf(t, orders[3], orders[6]), nil)
	require.Equal(t, []error{nil, nil}, errs)
	require.Equal(t, int64(1), b.ledgerRows(t, 4))
	require.Equal(t, int64(1), b.ledgerRows(t, 7))
}

// Eight batches over overlapping keys, concurrently, with effects that
// touch shared balance rows in arbitrary order: every order exactly once.
func TestBatchConcurrentOverlappingBatches(t *testing.T) {
	forEachBatchMode(t, testBatchConcurrentOverlappingBatches)
}

func testBatchConcurrentOverlappingBatches(t *testing.T, run batchRun) {
	b := setup(t, 10)
	rec := &outcomes{}
	c := b.claim(t, "loyalty", rec)
	c.MaxAttempts = 20
	bt := newBatch(t, c)
	const orders = 60
	inParallel(t, 8, func(w int) []error {
		var os []order
		for i := 0; i < orders; i++ {
			id := int64((i*7+w*13)%orders + 1) // each batch a different order
			os = append(os, order{OrderID: id, CustomerID: id % 5, TotalCents: 100})
		}
		return run(bt, context.Background(), batchOf(t, os...), nil)
	})
	require.Equal(t, orders, rec.count(framework.Applied))
	require.Equal(t, 7*orders, rec.count(framework.Duplicate))
	require.Equal(t, int64(orders), b.scalar(t, "SELECT count(*) FROM point_ledger"))
	require.Equal(t, int64(orders), b.scalar(t, "SELECT sum(points) FROM balances"))
}

// A batch whose key is held by an uncommitted twin waits; when the twin
// rolls back, the batch takes over and applies.
func TestBatchRollbackHandOver(t *testing.T) { forEachBatchMode(t, testBatchRollbackHandOver) }

func testBatchRollbackHandOver(t *testing.T, run batchRun) {
	b, rec, bt := batchSetup(t, 4)
	ctx := context.Background()
	holder := b.holdClaim(t, "loyalty", "order-completed:2")

	done := make(chan []error, 1)
	go func() {
		done <- run(bt, ctx, batchOf(t, order{OrderID: 1, CustomerID: 1, TotalCents: 100}, order{OrderID: 2, CustomerID: 1, TotalCents: 100}), nil)
	}()
	require.Eventually(t, func() bool {
		return b.scalar(t, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%' || $1 || '%'`, b.schema) == 1
	}, 10*time.Second, 5*time.Millisecond, "the batch must wait on the held key")
	require.NoError(t, holder.Rollback(ctx))
	require.Equal(t, []error{nil, nil}, <-done)
	require.Equal(t, 2, rec.count(framework.Applied))
	require.Equal(t, int64(2), b.balance(t, 1))
}

func TestBatchBadConfig(t *testing.T) {
	t.Parallel()
	var ce *framework.ConfigError
	_, err := middleware.NewBatch(middleware.Claim{})
	require.ErrorAs(t, err, &ce)
	require.Equal(t, "Store", ce.Field)
	// A Batch not built by NewBatch fails every message instead of
	// panicking.
	var nilBatch *middleware.Batch
	for _, bt := range []*middleware.Batch{{}, nilBatch} {
		errs := bt.Process(context.Background(), batchOf(t, order{OrderID: 1}), creditSet)
		require.ErrorAs(t, errs[0], &ce)
		require.Equal(t, "Batch", ce.Field)
	}
	b := setup(t, 2)
	errs := b.batch(t, nil).Process(context.Background(), batchOf(t, order{OrderID: 1}), nil)
	require.ErrorAs(t, errs[0], &ce)
	require.Equal(t, "handler", ce.Field)

	// Claim options batches do not implement are refused, not ignored.
	for field, edit := range map[string]func(*middleware.Claim){
		"Mode":        func(c *middleware.Claim) { c.Mode = middleware.ModeNaturalKey },
		"OutboxTopic": func(c *middleware.Claim) { c.OutboxTopic = "receipts" },
		"Fingerprint": func(c *middleware.Claim) { c.Fingerprint = true },
		"EventTime": func(c *middleware.Claim) {
			c.EventTime = func(*message.Message) (time.Time, error) { return time.Now(), nil }
		},
	} {
		c := b.claim(t, "loyalty", nil)
		edit(&c)
		bt, err := middleware.NewBatch(c)
		require.ErrorAs(t, err, &ce, field)
		require.Equal(t, field, ce.Field)
		require.Nil(t, bt)
	}
	require.Equal(t, int64(0), b.claims(t, "loyalty"))
}

// The fast path: a clean batch calls the set handler once and commits once;
// a batch with one failing message among 16 still applies the other 15,
// isolating it in about log2(16) savepointed halves.
func TestBatchSetHandlerCalls(t *testing.T) {
	t.Parallel()
	b, _, bt := batchSetup(t, 4)
	var sizes []int
	boom := errors.New("rejected")
	var orders []order
	for i := int64(1); i <= 16; i++ {
		orders = append(orders, order{OrderID: i, CustomerID: i % 4, TotalCents: 100})
	}
	h := func(ctx context.Context, tx pgx.Tx, msgs []*message.Message) error {
		sizes = append(sizes, len(msgs))
		if err := creditSet(ctx, tx, msgs); err != nil {
			return err
		}
		for _, m := range msgs {
			if m.Metadata.Get("event_id") == "evt-21" {
				return boom
			}
		}
		return nil
	}
	errs := bt.Process(context.Background(), batchOf(t, orders...), h)
	require.Equal(t, make([]error, 16), errs)
	require.Equal(t, []int{16}, sizes, "one call for a clean batch")

	sizes = nil
	for i := range orders {
		orders[i].OrderID += 16 // 17..32, order 21 fails
	}
	errs = bt.Process(context.Background(), batchOf(t, orders...), h)
	for i, err := range errs {
		if orders[i].OrderID == 21 {
			require.ErrorIs(t, err, boom)
		} else {
			require.NoError(t, err, "order %d", orders[i].OrderID)
		}
	}
	// fast pass (16), bisection 16→8→4→2→1 plus each clean sibling (8,4,2,1),
	// then the commit pass without the failure (15).
	require.Equal(t, 16+16+8+8+4+4+2+2+1+1+15, sum(sizes), "calls: %v", sizes)
	require.Equal(t, int64(31), b.claims(t, "loyalty"))
	require.Equal(t, int64(0), b.ledgerRows(t, 21))
	require.Equal(t, int64(31), b.scalar(t, "SELECT count(*) FROM point_ledger"))
}

func sum(xs []int) int {
	n := 0
	for _, x := range xs {
		n += x
	}
	return n
}

// A batch abandoned during the backoff before a retry (shutdown) has
// applied nothing: every message must come back failed, to be nacked, not
// acked as if it had been applied.
func TestBatchRetryAbandonedFailsEveryMessage(t *testing.T) {
	forEachBatchMode(t, testBatchRetryAbandonedFailsEveryMessage)
}

func testBatchRetryAbandonedFailsEveryMessage(t *testing.T, run batchRun) {
	b := setup(t, 2)
	rec := &outcomes{}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c := b.claim(t, "loyalty", rec)
	c.InitialBackoff = time.Hour // only the cancellation ends the wait
	c.OnRetry = func(middleware.TxRetry) { cancel() }
	bt := newBatch(t, c)
	deadlock := &pgconn.PgError{Code: "40P01", Message: "deadlock detected"}
	errs := run(bt, ctx, batchOf(t, order{OrderID: 1, CustomerID: 1, TotalCents: 100}, order{OrderID: 2, CustomerID: 1, TotalCents: 100}),
		func(*message.Message) error { return deadlock })
	require.Len(t, errs, 2)
	for i, err := range errs {
		require.ErrorIs(t, err, context.Canceled, "message %d", i)
		require.False(t, framework.IsPermanent(err), "message %d", i)
	}
	require.Equal(t, 2, rec.count(framework.Failed))
	require.Equal(t, int64(0), b.claims(t, "loyalty"))
}
