package middleware_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
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
// does (Poison -> Park -> Claim -> handler, or a Batch whose failures go
// to Poison -> Park), called directly.
type ordered struct {
	b      bundle
	h      message.HandlerFunc // per message
	bt     *middleware.Batch   // in batch mode
	mode   orderedMode
	poison message.HandlerMiddleware
	parker *middleware.Parker
	dl     deadLetters
	rec    *outcomes

	mu     sync.Mutex
	broken map[string]bool // event ids that fail for good
}

// orderedMode is how an ordered consumer runs: per message (maxGroup 1),
// in groups, or in batches of batch messages through a set handler that
// loops over them or applies them in one statement (setWise).
type orderedMode struct {
	name     string
	maxGroup int
	batch    int
	setWise  bool
}

func newOrdered(t *testing.T, mode orderedMode) *ordered {
	t.Helper()
	return newOrderedRetry(t, mode, 0)
}

// newOrderedRetry is newOrdered with automatic releases after retry.
func newOrderedRetry(t *testing.T, mode orderedMode, retry time.Duration) *ordered {
	t.Helper()
	b := setup(t, 8)
	b.exec(t, `CREATE TABLE applied_events (n bigserial PRIMARY KEY, account text NOT NULL, seq int NOT NULL, id text NOT NULL UNIQUE)`)
	o := &ordered{b: b, mode: mode, dl: newDeadLetters(t), rec: &outcomes{}, broken: map[string]bool{}}
	key := mustKeySpec(t, "template:{payload.id}")
	orderKey := mustKeySpec(t, "template:{payload.account}")
	claim := middleware.Claim{Store: b.store, Consumer: "ledger", Key: key, OrderKey: orderKey, MaxGroup: mode.maxGroup, OnOutcome: o.rec.onOutcome}
	var err error
	o.poison, err = middleware.NewPoison(middleware.Poison{Publisher: o.dl, Topic: "orders.poison", Consumer: "ledger", Key: key})
	require.NoError(t, err)
	handler := consume(o.apply)
	if mode.batch > 0 {
		o.bt = newBatch(t, claim)
		// The release's handler: the set handler with one message.
		handler = func(msg *message.Message) ([]*message.Message, error) {
			tx, ok := framework.TxFromContext(msg.Context())
			require.True(t, ok)
			return nil, o.applySet(msg.Context(), tx, []*message.Message{msg})
		}
	}
	o.parker, err = middleware.NewPark(middleware.Park{Claim: claim, Handler: handler, Poison: o.poison, Retry: retry})
	require.NoError(t, err)
	if mode.batch == 0 {
		claimMW, err := middleware.NewClaim(claim)
		require.NoError(t, err)
		o.h = o.poison(o.parker.Middleware(claimMW(handler)))
	}
	return o
}

// applySet is the set handler: o.apply in a loop, or one statement
// applying msgs in their order.
func (o *ordered) applySet(ctx context.Context, tx pgx.Tx, msgs []*message.Message) error {
	if !o.mode.setWise {
		for _, msg := range msgs {
			if err := o.apply(ctx, tx, msg); err != nil {
				return err
			}
		}
		return nil
	}
	var accounts, ids []string
	var seqs []int
	for _, msg := range msgs {
		e, err := o.decode(msg)
		if err != nil {
			return err
		}
		accounts, seqs, ids = append(accounts, e.Account), append(seqs, e.Seq), append(ids, e.ID)
	}
	_, err := tx.Exec(ctx, `INSERT INTO applied_events (account, seq, id)
SELECT a, s, id FROM unnest($1::text[], $2::int[], $3::text[]) WITH ORDINALITY AS u(a, s, id, i) ORDER BY i`, accounts, seqs, ids)
	return err
}

// process runs msgs through the batch in batches of o.mode.batch and
// settles the results as framework/consumer's batch runner does: a
// permanent failure goes to Poison through Park, a held message runs again
// after its head unless that is nacked. It returns what would be nacked.
func (o *ordered) process(t testing.TB, msgs []*message.Message) (nacked []*message.Message) {
	t.Helper()
	for len(msgs) > 0 {
		n := min(o.mode.batch, len(msgs))
		batch := msgs[:n]
		msgs = msgs[n:]
		for len(batch) > 0 {
			errs := o.bt.Process(context.Background(), batch, o.applySet)
			require.Len(t, errs, len(batch))
			var again []*message.Message
			nack := make([]bool, len(batch))
			for i, err := range errs {
				var held *pg.HeldError
				switch {
				case err == nil:
				case errors.As(err, &held):
					require.Less(t, held.Head, i, "held behind an earlier message")
					if nack[held.Head] {
						nack[i], nacked = true, append(nacked, batch[i])
					} else {
						again = append(again, batch[i])
					}
				case framework.IsPermanent(err):
					_, perr := o.poison(o.parker.Middleware(func(*message.Message) ([]*message.Message, error) { return nil, err }))(batch[i])
					if perr != nil {
						nack[i], nacked = true, append(nacked, batch[i])
					}
				default:
					nack[i], nacked = true, append(nacked, batch[i])
				}
			}
			batch = again
		}
	}
	return nacked
}

// decode reads msg's event and fails it for good if the test broke it, so
// that the per-message and the set handler refuse the same events alike.
func (o *ordered) decode(msg *message.Message) (event, error) {
	var e event
	if err := json.Unmarshal(msg.Payload, &e); err != nil {
		return e, framework.Permanent(err)
	}
	o.mu.Lock()
	broken := o.broken[e.ID]
	o.mu.Unlock()
	if broken {
		return e, framework.Permanent(fmt.Errorf("event %s cannot be applied", e.ID))
	}
	return e, nil
}

func (o *ordered) apply(ctx context.Context, tx pgx.Tx, msg *message.Message) error {
	e, err := o.decode(msg)
	if err != nil {
		return err
	}
	_, err = tx.Exec(ctx, "INSERT INTO applied_events (account, seq, id) VALUES ($1, $2, $3)", e.Account, e.Seq, e.ID)
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
	o.deliverAll(t, eventMsg(t, account, seq))
}

// deliverAll hands msgs to the chain, one by one or in batches, and
// requires that each would be acked.
func (o *ordered) deliverAll(t testing.TB, msgs ...*message.Message) {
	t.Helper()
	if o.bt != nil {
		require.Empty(t, o.process(t, msgs), "nacked")
		return
	}
	for _, msg := range msgs {
		_, err := o.h(msg)
		require.NoError(t, err, string(msg.Payload))
	}
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
	var msgs []*message.Message
	for seq := 1; seq <= 5; seq++ {
		msgs = append(msgs, eventMsg(t, "K", seq), eventMsg(t, "A", seq), eventMsg(t, "B", seq))
	}
	o.deliverAll(t, msgs...)
	require.Equal(t, []int{1}, o.applied(t, "K"))
	require.Equal(t, []int{2, 3, 4, 5}, o.parked(t, "K"))
	for _, other := range []string{"A", "B"} {
		require.Equal(t, []int{1, 2, 3, 4, 5}, o.applied(t, other), "other keys flow on")
		require.Empty(t, o.parked(t, other))
	}
	if o.bt == nil {
		// In a batch, the messages held behind it fail their pass too.
		require.Equal(t, 1, o.rec.count(framework.Failed), "only event 2's own pass failed")
	}
	require.Equal(t, 3, o.rec.count(framework.Parked), "3..5 parked behind it by the claim")
}

// orderedModes runs test in parallel subtests, one per orderedMode: per
// message, grouped, and batches that hold the whole table, that cut it
// (event 2 in the batch of event 1, 3 in the next), and of one message.
func orderedModes(t *testing.T, run func(t *testing.T, mode orderedMode)) {
	for _, mode := range []orderedMode{
		{name: "per-message", maxGroup: 1},
		{name: "group", maxGroup: testenv.MaxGroup()},
		{name: "batch-set-15", batch: 15, setWise: true},
		{name: "batch-loop-15", batch: 15},
		{name: "batch-set-4", batch: 4, setWise: true},
		{name: "batch-loop-1", batch: 1},
	} {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			run(t, mode)
		})
	}
}

func TestOrderedRetryAppliesParkedInOrder(t *testing.T) {
	t.Parallel()
	orderedModes(t, func(t *testing.T, mode orderedMode) {
		o := newOrdered(t, mode)
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
	orderedModes(t, func(t *testing.T, mode orderedMode) {
		o := newOrdered(t, mode)
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
	orderedModes(t, func(t *testing.T, mode orderedMode) {
		o := newOrdered(t, mode)
		o.deliverTable(t)
		// Fresh transport ids: the failed head, one parked behind it, one
		// applied before it.
		o.deliverAll(t, eventMsg(t, "K", 2), eventMsg(t, "K", 4), eventMsg(t, "K", 1))
		require.Equal(t, []int{2, 3, 4, 5}, o.parked(t, "K"), "no message parked twice")
		require.Equal(t, []int{1}, o.applied(t, "K"))

		// Concurrent twins of the key's next event: parked once.
		var wg sync.WaitGroup
		errs := make([]error, 4)
		for i := range errs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if o.bt != nil {
					// A batch of two copies, beside the other batches.
					if nacked := o.process(t, []*message.Message{eventMsg(t, "K", 6), eventMsg(t, "K", 6)}); len(nacked) > 0 {
						errs[i] = fmt.Errorf("%d nacked", len(nacked))
					}
					return
				}
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
	o := newOrderedRetry(t, orderedMode{name: "per-message", maxGroup: 1}, retry)
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

// A message whose order key cannot be derived (no such field, or a key
// over the key policy's limit) is applied without order, even while
// other keys are parked, and says so in its Result; failing for good, it
// is poisoned, not parked.
func TestOrderedUnusableOrderKey(t *testing.T) {
	t.Parallel()
	orderedModes(t, func(t *testing.T, mode orderedMode) {
		o := newOrdered(t, mode)
		o.setBroken("K-2", true)
		o.setBroken("none-2", true)
		noField := func(id string) *message.Message {
			msg := message.NewMessage("uuid-"+id, []byte(fmt.Sprintf(`{"id":%q,"seq":1}`, id)))
			msg.SetContext(context.Background())
			return msg
		}
		long := strings.Repeat("a", 600) // over KeyPolicy's 512 bytes
		longMsg := message.NewMessage("uuid-long", []byte(fmt.Sprintf(`{"id":"long-1","account":%q,"seq":1}`, long)))
		longMsg.SetContext(context.Background())
		o.deliverAll(t, eventMsg(t, "K", 1), eventMsg(t, "K", 2), noField("none-1"), longMsg, noField("none-2"))
		require.Equal(t, []int{1}, o.applied(t, "K"))
		require.Equal(t, []int{2}, o.parked(t, "K"))
		require.Equal(t, []int{1}, o.applied(t, ""), "none-1 applied without order")
		require.Equal(t, []int{1}, o.applied(t, long), "the long key's event applied without order")

		cp := o.dl.next(t, "none-2 failed for good without an order key: poisoned")
		var e event
		require.NoError(t, json.Unmarshal(cp.Payload, &e))
		require.Equal(t, "none-2", e.ID)

		o.rec.mu.Lock()
		defer o.rec.mu.Unlock()
		unordered := map[string]bool{}
		for _, r := range o.rec.results {
			var e event
			require.NoError(t, json.Unmarshal(r.Message.Payload, &e))
			unordered[e.ID] = unordered[e.ID] || r.Unordered
		}
		require.Equal(t, map[string]bool{"K-1": false, "K-2": false, "none-1": true, "long-1": true, "none-2": true}, unordered)
	})
}
