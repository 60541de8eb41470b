package middleware_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/internal/pg"
	"github.com/claimtx/claimtx/internal/testenv"
	"github.com/claimtx/claimtx/middleware"
)

// event is one event of an aggregate: applied in seq order per account.
type event struct {
	ID      string `json:"id"`
	Account string `json:"account"`
	Seq     int    `json:"seq"`
}

// ordered is a consumer with an order key, wired as framework/consumer
// does (Poison -> Park -> Claim -> handler), called directly.
type ordered struct {
	b      bundle
	h      message.HandlerFunc
	parker *middleware.Parker
	dl     deadLetters
	rec    *outcomes

	mu     sync.Mutex
	broken map[string]bool // event ids that fail for good
}

func newOrdered(t *testing.T, maxGroup int) *ordered {
	t.Helper()
	return newOrderedRetry(t, maxGroup, 0)
}

// newOrderedRetry is newOrdered with automatic releases after retry.
func newOrderedRetry(t *testing.T, maxGroup int, retry time.Duration) *ordered {
	t.Helper()
	b := setup(t, 8)
	b.exec(t, `CREATE TABLE applied_events (n bigserial PRIMARY KEY, account text NOT NULL, seq int NOT NULL, id text NOT NULL UNIQUE)`)
	o := &ordered{b: b, dl: newDeadLetters(t), rec: &outcomes{}, broken: map[string]bool{}}
	key, err := framework.ParseKeySpec("template:{payload.id}")
	require.NoError(t, err)
	orderKey, err := framework.ParseKeySpec("template:{payload.account}")
	require.NoError(t, err)
	claim := middleware.Claim{Store: b.store, Consumer: "ledger", Key: key, OrderKey: orderKey, MaxGroup: maxGroup, OnOutcome: o.rec.onOutcome}
	claimMW, err := middleware.NewClaim(claim)
	require.NoError(t, err)
	poisonMW, err := middleware.NewPoison(middleware.Poison{Publisher: o.dl, Topic: "orders.poison", Consumer: "ledger", Key: key})
	require.NoError(t, err)
	handler := consume(o.apply)
	o.parker, err = middleware.NewPark(middleware.Park{Claim: claim, Handler: handler, Poison: poisonMW, Retry: retry})
	require.NoError(t, err)
	o.h = poisonMW(o.parker.Middleware(claimMW(handler)))
	return o
}

func (o *ordered) apply(ctx context.Context, tx pgx.Tx, msg *message.Message) error {
	var e event
	if err := json.Unmarshal(msg.Payload, &e); err != nil {
		return framework.Permanent(err)
	}
	o.mu.Lock()
	broken := o.broken[e.ID]
	o.mu.Unlock()
	if broken {
		return framework.Permanent(fmt.Errorf("event %s cannot be applied", e.ID))
	}
	_, err := tx.Exec(ctx, "INSERT INTO applied_events (account, seq, id) VALUES ($1, $2, $3)", e.Account, e.Seq, e.ID)
	return err
}

func (o *ordered) setBroken(id string, broken bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.broken[id] = broken
}

func eventMsg(t testing.TB, account string, seq int) *message.Message {
	t.Helper()
	payload, err := json.Marshal(event{ID: fmt.Sprintf("%s-%d", account, seq), Account: account, Seq: seq})
	require.NoError(t, err)
	msg := message.NewMessage(fmt.Sprintf("uuid-%s-%d-%d", account, seq, time.Now().UnixNano()), payload)
	msg.SetContext(context.Background())
	return msg
}

// deliver hands msg to the chain and requires that the router would ack it.
func (o *ordered) deliver(t testing.TB, account string, seq int) {
	t.Helper()
	_, err := o.h(eventMsg(t, account, seq))
	require.NoError(t, err, "%s-%d", account, seq)
}

// applied is the seqs of account's applied events, in the order applied.
func (o *ordered) applied(t testing.TB, account string) []int {
	t.Helper()
	rows, err := o.b.pool.Query(context.Background(), "SELECT seq FROM applied_events WHERE account = $1 ORDER BY n", account)
	require.NoError(t, err)
	seqs, err := pgx.CollectRows(rows, pgx.RowTo[int])
	require.NoError(t, err)
	return seqs
}

// parked is the seqs of account's parked messages, in order.
func (o *ordered) parked(t testing.TB, account string) []int {
	t.Helper()
	ms, err := pg.ParkingOf(o.b.store).Messages(context.Background(), "ledger", account, 100)
	require.NoError(t, err)
	seqs := []int{}
	for _, m := range ms {
		var e event
		require.NoError(t, json.Unmarshal(m.Payload, &e))
		seqs = append(seqs, e.Seq)
	}
	return seqs
}

// release asks for a release of account (its head skipped when skip) and
// runs the releaser until the key is no longer due.
func (o *ordered) release(t *testing.T, account string, skip bool) {
	t.Helper()
	ctx := context.Background()
	ok, err := pg.ParkingOf(o.b.store).Request(ctx, "ledger", account, skip, "tester", "the handler is fixed")
	require.NoError(t, err)
	require.True(t, ok, "the key is parked")
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- o.parker.Run(rctx) }()
	defer func() { cancel(); require.NoError(t, <-done) }()
	require.Eventually(t, func() bool {
		due, err := pg.ParkingOf(o.b.store).Due(ctx, "ledger", 10)
		require.NoError(t, err)
		return len(due) == 0
	}, 10*time.Second, 20*time.Millisecond, "the release ran")
}

// deliverTable delivers events 1..5 of K, event 2 broken, with other keys'
// events interleaved, and checks the parking.
func (o *ordered) deliverTable(t *testing.T) {
	t.Helper()
	o.setBroken("K-2", true)
	for seq := 1; seq <= 5; seq++ {
		o.deliver(t, "K", seq)
		o.deliver(t, "A", seq)
		o.deliver(t, "B", seq)
	}
	require.Equal(t, []int{1}, o.applied(t, "K"))
	require.Equal(t, []int{2, 3, 4, 5}, o.parked(t, "K"))
	for _, other := range []string{"A", "B"} {
		require.Equal(t, []int{1, 2, 3, 4, 5}, o.applied(t, other), "other keys flow on")
		require.Empty(t, o.parked(t, other))
	}
	require.Equal(t, 1, o.rec.count(framework.Failed), "only event 2's own pass failed")
	require.Equal(t, 3, o.rec.count(framework.Parked), "3..5 parked behind it by the claim")
}

func groupModes(t *testing.T, run func(t *testing.T, maxGroup int)) {
	for _, mode := range []struct {
		name     string
		maxGroup int
	}{{"per-message", 1}, {"group", testenv.MaxGroup()}} {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			run(t, mode.maxGroup)
		})
	}
}

func TestOrderedRetryAppliesParkedInOrder(t *testing.T) {
	t.Parallel()
	groupModes(t, func(t *testing.T, maxGroup int) {
		o := newOrdered(t, maxGroup)
		o.deliverTable(t)

		// A release while it still fails keeps everything parked.
		o.release(t, "K", false)
		require.Equal(t, []int{2, 3, 4, 5}, o.parked(t, "K"))
		k, ok, err := pg.ParkingOf(o.b.store).Key(context.Background(), "ledger", "K")
		require.NoError(t, err)
		require.True(t, ok)
		require.Equal(t, 2, k.Failures)
		require.Contains(t, k.Reason, "event K-2 cannot be applied")

		o.setBroken("K-2", false)
		o.release(t, "K", false)
		require.Equal(t, []int{1, 2, 3, 4, 5}, o.applied(t, "K"), "applied in order, once each")
		require.Empty(t, o.parked(t, "K"))
		_, ok, err = pg.ParkingOf(o.b.store).Key(context.Background(), "ledger", "K")
		require.NoError(t, err)
		require.False(t, ok, "the key is released")

		// Released: the key's next event applies at once, and every copy
		// of an applied one is a duplicate.
		o.deliver(t, "K", 6)
		o.deliver(t, "K", 3)
		require.Equal(t, []int{1, 2, 3, 4, 5, 6}, o.applied(t, "K"))
		require.Equal(t, int64(16), o.b.claims(t, "ledger"), "K 1..6, A and B 1..5")
	})
}

func TestOrderedSkipPoisonsHeadAndAppliesTheRest(t *testing.T) {
	t.Parallel()
	groupModes(t, func(t *testing.T, maxGroup int) {
		o := newOrdered(t, maxGroup)
		o.deliverTable(t)
		o.release(t, "K", true)
		cp := o.dl.next(t, "the skipped head is in the poison destination")
		var e event
		require.NoError(t, json.Unmarshal(cp.Payload, &e))
		require.Equal(t, "K-2", e.ID)
		reason := cp.Metadata.Get(middleware.PoisonReasonKey)
		require.Contains(t, reason, `skipped by "tester" (the handler is fixed)`)
		require.Contains(t, reason, "event K-2 cannot be applied")
		require.Equal(t, []int{1, 3, 4, 5}, o.applied(t, "K"))
		require.Empty(t, o.parked(t, "K"))
	})
}

func TestOrderedDuplicatesOfParkedAndApplied(t *testing.T) {
	t.Parallel()
	groupModes(t, func(t *testing.T, maxGroup int) {
		o := newOrdered(t, maxGroup)
		o.deliverTable(t)
		// Fresh transport ids: the failed head, one parked behind it, one
		// applied before it.
		o.deliver(t, "K", 2)
		o.deliver(t, "K", 4)
		o.deliver(t, "K", 1)
		require.Equal(t, []int{2, 3, 4, 5}, o.parked(t, "K"), "no message parked twice")
		require.Equal(t, []int{1}, o.applied(t, "K"))

		// Concurrent twins of the key's next event: parked once.
		var wg sync.WaitGroup
		errs := make([]error, 4)
		for i := range errs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, errs[i] = o.h(eventMsg(t, "K", 6))
			}()
		}
		wg.Wait()
		require.NoError(t, errors.Join(errs...))
		require.Equal(t, []int{2, 3, 4, 5, 6}, o.parked(t, "K"))
	})
}

// TestOrderedAutomaticRetry: with Park.Retry a parked key is released on
// its own, a failed release doubling the delay.
func TestOrderedAutomaticRetry(t *testing.T) {
	t.Parallel()
	const retry = 300 * time.Millisecond
	o := newOrderedRetry(t, 1, retry)
	o.setBroken("K-2", true)
	for seq := 1; seq <= 3; seq++ {
		o.deliver(t, "K", seq)
	}
	parking := pg.ParkingOf(o.b.store)
	ctx := context.Background()
	k, ok, err := parking.Key(ctx, "ledger", "K")
	require.NoError(t, err)
	require.True(t, ok)
	require.NotNil(t, k.RetryAt, "the first automatic release is due")
	require.WithinDuration(t, k.ParkedAt.Add(retry), *k.RetryAt, 250*time.Millisecond)

	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- o.parker.Run(rctx) }()
	defer func() { cancel(); require.NoError(t, <-done) }()
	// The first release fails: the next is due twice as late.
	require.Eventually(t, func() bool {
		k, _, err = parking.Key(ctx, "ledger", "K")
		require.NoError(t, err)
		return k.Failures == 2
	}, 10*time.Second, 20*time.Millisecond)
	require.NotNil(t, k.RetryAt)
	// The first release ran no earlier than retry after parking, and set
	// the next 2 x retry after itself.
	require.GreaterOrEqual(t, k.RetryAt.Sub(k.ParkedAt), 3*retry, "backed off")
	o.setBroken("K-2", false)
	require.Eventually(t, func() bool { return len(o.parked(t, "K")) == 0 }, 10*time.Second, 20*time.Millisecond)
	require.Equal(t, []int{1, 2, 3}, o.applied(t, "K"))
}
