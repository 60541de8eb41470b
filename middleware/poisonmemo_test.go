package middleware_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/internal/pg"
	"github.com/claimtx/claimtx/internal/poison"
	"github.com/claimtx/claimtx/internal/testenv"
	"github.com/claimtx/claimtx/middleware"
)

// memoClaim is the "memo" consumer's claim, reporting to rec, with its
// poison memo on.
func (b bundle) memoClaim(t testing.TB, rec *outcomes) middleware.Claim {
	t.Helper()
	c := b.claim(t, "memo", rec)
	c.PoisonMemo = true
	return c
}

func (b bundle) memo(t testing.TB, consumer string, id int64) (pg.Memo, bool) {
	t.Helper()
	m, ok, err := pg.MemosOf(b.pool, b.names()).Get(context.Background(), consumer, fmt.Sprintf("order-completed:%d", id))
	require.NoError(t, err)
	return m, ok
}

// The bare middleware, composed by hand as the README's quick start does,
// with Claim.RecordPoison as the Poison middleware's OnPoison.
func TestPoisonMemoBareMiddleware(t *testing.T) {
	t.Parallel()
	b := setup(t, 4)
	dead := newDeadLetters(t)

	rec := &outcomes{}
	claim := b.memoClaim(t, rec)
	poisoner := testenv.Install(t, middleware.NewPoison, middleware.Poison{Publisher: dead, Topic: "orders.poison", OnPoison: claim.RecordPoison})
	var runs atomic.Int64
	fixed := atomic.Bool{}
	h := poisoner(testenv.Install(t, middleware.NewClaim, claim)(consume(func(ctx context.Context, tx pgx.Tx, msg *message.Message) error {
		runs.Add(1)
		if !fixed.Load() {
			return framework.Permanent(errors.New("refused for good"))
		}
		return credit(ctx, tx, msg)
	})))
	next := func() *message.Message { return dead.next(t, "nothing poisoned") }

	o := order{OrderID: 1, CustomerID: 7, TotalCents: 500}
	_, err := h(newDelivery(t, o))
	require.NoError(t, err)
	require.Equal(t, "refused for good", next().Metadata.Get(middleware.PoisonReasonKey))
	m, ok := b.memo(t, "memo", 1)
	require.True(t, ok)
	require.Equal(t, "refused for good", m.Reason)
	require.EqualValues(t, 1, m.Seen)

	for range 2 {
		_, err = h(newDelivery(t, o))
		require.NoError(t, err)
		require.Equal(t, "poison memo: refused for good", next().Metadata.Get(middleware.PoisonReasonKey))
	}
	require.EqualValues(t, 1, runs.Load(), "memoised copies do not run the handler")
	m, _ = b.memo(t, "memo", 1)
	require.EqualValues(t, 3, m.Seen)
	require.Equal(t, "refused for good", m.Reason)
	require.Zero(t, b.claims(t, "memo"), "a memo hit leaves no claim")

	// Another consumer of the same table has its own memos.
	other := b.claim(t, "other", nil)
	other.PoisonMemo = true
	_, err = testenv.Install(t, middleware.NewClaim, other)(consume(credit))(newDelivery(t, o))
	require.NoError(t, err)
	require.EqualValues(t, 1, b.claims(t, "other"))

	n, err := pg.MemosOf(b.pool, b.names()).Clear(context.Background(), pg.MemoFilter{Consumer: "memo", Keys: []string{"order-completed:1"}})
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	fixed.Store(true)
	_, err = h(newDelivery(t, o))
	require.NoError(t, err)
	require.EqualValues(t, 2, runs.Load())
	require.EqualValues(t, 1, b.claims(t, "memo"))
	require.EqualValues(t, 2, b.ledgerRows(t, 1), "applied once for memo, once for other")
}

// A duplicate stays a duplicate whatever its memo says: the effect is
// there, so the copy is acked, not dead-lettered. A memo and a claim of one
// key can meet when a handler failed once and a twin then succeeded.
func TestPoisonMemoYieldsToDuplicate(t *testing.T) {
	t.Parallel()
	b := setup(t, 4)
	rec := &outcomes{}
	claim := b.memoClaim(t, rec)
	h := testenv.Install(t, middleware.NewClaim, claim)(consume(credit))
	o := order{OrderID: 5, CustomerID: 7, TotalCents: 500}
	_, err := h(newDelivery(t, o))
	require.NoError(t, err)
	claim.RecordPoison(newDelivery(t, o), errors.New("a twin failed"))
	_, ok := b.memo(t, "memo", 5)
	require.True(t, ok)
	_, err = h(newDelivery(t, o))
	require.NoError(t, err)
	require.Equal(t, 1, rec.count(framework.Applied))
	require.Equal(t, 1, rec.count(framework.Duplicate))
	require.Zero(t, rec.count(framework.Failed))
}

// An unpoison that lands between a memo hit's dead-lettering and its
// record (the record runs after the publish) stays done: the late record
// of the hit must not write the memo again, or the operator's unpoison is
// undone and the next copy is dead-lettered once more.
func TestUnpoisonWinsOverALateMemoHit(t *testing.T) {
	t.Parallel()
	b := setup(t, 4)
	dead := newDeadLetters(t)
	claim := b.memoClaim(t, nil)
	names := b.names()
	var unpoisonFirst atomic.Bool
	onPoison := func(msg *message.Message, err error) {
		if unpoisonFirst.Load() {
			_, cerr := pg.MemosOf(b.pool, names).Clear(context.Background(), pg.MemoFilter{Consumer: "memo", Keys: []string{"order-completed:3"}})
			require.NoError(t, cerr)
		}
		claim.RecordPoison(msg, err)
	}
	reason := func() string { return dead.next(t, "nothing poisoned").Metadata.Get(middleware.PoisonReasonKey) }
	poisoner := testenv.Install(t, middleware.NewPoison, middleware.Poison{Publisher: dead, Topic: "orders.poison", OnPoison: onPoison})
	var fixed atomic.Bool
	h := poisoner(testenv.Install(t, middleware.NewClaim, claim)(consume(func(ctx context.Context, tx pgx.Tx, msg *message.Message) error {
		if !fixed.Load() {
			return framework.Permanent(errors.New("refused for good"))
		}
		return credit(ctx, tx, msg)
	})))

	o := order{OrderID: 3, CustomerID: 7, TotalCents: 500}
	_, err := h(newDelivery(t, o))
	require.NoError(t, err)
	require.Equal(t, "refused for good", reason())
	_, ok := b.memo(t, "memo", 3)
	require.True(t, ok, "the handler's failure is memoised")

	unpoisonFirst.Store(true)
	_, err = h(newDelivery(t, o))
	require.NoError(t, err)
	require.Equal(t, "poison memo: refused for good", reason(), "this copy is a memo hit")
	_, ok = b.memo(t, "memo", 3)
	require.False(t, ok, "the hit's late record wrote the cleared memo again")

	fixed.Store(true)
	_, err = h(newDelivery(t, o))
	require.NoError(t, err)
	require.EqualValues(t, 1, b.ledgerRows(t, 3), "after unpoison the next copy runs the handler")
}

// RecordPoison records only what a memo is for.
func TestRecordPoisonSkips(t *testing.T) {
	t.Parallel()
	b := setup(t, 2)
	claim := b.claim(t, "memo", nil)
	msg := newDelivery(t, order{OrderID: 9, CustomerID: 1, TotalCents: 100})
	claim.RecordPoison(msg, errors.New("boom"))
	_, ok := b.memo(t, "memo", 9)
	require.False(t, ok, "PoisonMemo off: nothing recorded")

	claim.PoisonMemo = true
	claim.RecordPoison(msg, &framework.ExpiredError{EventTime: time.Now().AddDate(0, -2, 0), Horizon: time.Now().AddDate(0, -1, 0), Retention: 30 * 24 * time.Hour})
	_, ok = b.memo(t, "memo", 9)
	require.False(t, ok, "expired messages get no memo")

	keyless := testenv.Message(`{"customer_id": 1}`)
	claim.RecordPoison(keyless, errors.New("no key"))
	require.Zero(t, b.scalar(t, "SELECT count(*) FROM "+b.table("processed_messages_poison_memo")))

	// NUL bytes and invalid UTF-8 in the reason are stored, cleaned.
	claim.RecordPoison(msg, errors.New("bad\x00 reason \xff"))
	m, ok := b.memo(t, "memo", 9)
	require.True(t, ok)
	require.Equal(t, "bad reason \uFFFD", m.Reason)
}

func TestPoisonMemoRefusedInNaturalKeyMode(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	var ce *framework.ConfigError
	require.ErrorAs(t, configErr(middleware.NewClaim, middleware.Claim{Store: b.store, Consumer: "x", Mode: middleware.ModeNaturalKey, PoisonMemo: true}), &ce)
	require.Equal(t, "PoisonMemo", ce.Field)
}

// In a batch, memoised keys fail with the memo's reason without reaching
// the set handler, and their claims do not commit; the others are applied,
// and a memoised duplicate stays a duplicate.
func TestPoisonMemoBatch(t *testing.T) {
	t.Parallel()
	b := setup(t, 4)
	rec := &outcomes{}
	claim := b.memoClaim(t, rec)
	bt := newBatch(t, claim)
	ctx := context.Background()
	orders := []order{{OrderID: 1, CustomerID: 1, TotalCents: 100}, {OrderID: 2, CustomerID: 2, TotalCents: 100}, {OrderID: 3, CustomerID: 3, TotalCents: 100}, {OrderID: 4, CustomerID: 4, TotalCents: 100}}
	// Order 4 applied first; then memos for 2 and 4.
	for _, err := range bt.Process(ctx, []*message.Message{newDelivery(t, orders[3])}, creditSet) {
		require.NoError(t, err)
	}
	claim.RecordPoison(newDelivery(t, orders[1]), errors.New("order 2 is bad"))
	claim.RecordPoison(newDelivery(t, orders[3]), errors.New("order 4 twin failed"))

	var seen []int64
	msgs := []*message.Message{newDelivery(t, orders[0]), newDelivery(t, orders[1]), newDelivery(t, orders[2]), newDelivery(t, orders[3]), newDelivery(t, orders[1])}
	errs := bt.Process(ctx, msgs, func(ctx context.Context, tx pgx.Tx, set []*message.Message) error {
		for _, m := range set {
			o := order{}
			require.NoError(t, json.Unmarshal(m.Payload, &o))
			seen = append(seen, o.OrderID)
		}
		return creditSet(ctx, tx, set)
	})
	require.ElementsMatch(t, []int64{1, 3}, seen, "the set handler saw the orders without a memo only")
	require.NoError(t, errs[0])
	require.NoError(t, errs[2])
	require.NoError(t, errs[3], "a memoised duplicate is a duplicate")
	for _, i := range []int{1, 4} {
		require.Error(t, errs[i])
		require.True(t, framework.IsPermanent(errs[i]))
		require.True(t, poison.IsHit(errs[i]))
		require.Equal(t, "poison memo: order 2 is bad", errs[i].Error())
	}
	require.EqualValues(t, 3, b.claims(t, "memo"), "orders 1, 3, 4: order 2's claim did not commit")
	require.Zero(t, b.ledgerRows(t, 2))
}

// The memo lookup rides in the claim's pipeline: a fresh message costs the
// same round trips with PoisonMemo as without (BEGIN+claim, the effect's
// two statements, COMMIT), per message and per batch.
func TestPoisonMemoAddsNoRoundTrip(t *testing.T) {
	t.Parallel()
	st, rt := traced(t, setup(t, 2))

	count := func(memo bool, id int64) int64 {
		c := middleware.Claim{Store: st, Consumer: fmt.Sprintf("rt-%v", memo), Key: keyFunc(t), PoisonMemo: memo}
		h := testenv.Install(t, middleware.NewClaim, c)(consume(credit))
		msg := newDelivery(t, order{OrderID: id, CustomerID: 1, TotalCents: 100})
		before := rt.n.Load()
		_, err := h(msg)
		require.NoError(t, err)
		return rt.n.Load() - before
	}
	plain, memo := count(false, 1), count(true, 2)
	require.EqualValues(t, 4, plain, "BEGIN+claim, two effect statements, COMMIT")
	require.Equal(t, plain, memo, "per message: the memo lookup costs no round trip")

	batchCount := func(memo bool, first int64) int64 {
		c := middleware.Claim{Store: st, Consumer: fmt.Sprintf("rt-batch-%v", memo), Key: keyFunc(t), PoisonMemo: memo}
		bt := newBatch(t, c)
		msgs := []*message.Message{newDelivery(t, order{OrderID: first, CustomerID: 1, TotalCents: 100}), newDelivery(t, order{OrderID: first + 1, CustomerID: 2, TotalCents: 100})}
		before := rt.n.Load()
		for _, err := range bt.Process(context.Background(), msgs, creditSet) {
			require.NoError(t, err)
		}
		return rt.n.Load() - before
	}
	plain, memo = batchCount(false, 10), batchCount(true, 20)
	require.EqualValues(t, 3, plain, "BEGIN+claim, the set statement, COMMIT")
	require.Equal(t, plain, memo, "per batch: the memo lookup costs no round trip")
}
