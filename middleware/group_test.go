package middleware_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/internal/testenv"
	"github.com/claimtx/claimtx/middleware"
)

// groupAwait bounds every wait of the group tests for a condition: long
// enough for a loaded 2-core machine under -race, short enough to fail a
// hung run.
const groupAwait = 30 * time.Second

// The statements of a group transaction, as the tracer records them.
const (
	sqlSavepoint  = "SAVEPOINT claimtx_group"
	sqlRollbackTo = "ROLLBACK TO SAVEPOINT claimtx_group"
	sqlCommit     = "commit"
)

// exactly counts the statements of sql equal to stmt.
func exactly(sql []string, stmt string) int {
	n := 0
	for _, s := range sql {
		if s == stmt {
			n++
		}
	}
	return n
}

// groupRig is a claim of the test schema on a pool of its own, of conns
// connections, whose statements are recorded; the handlers it builds
// credit each order and record the transaction they ran in.
type groupRig struct {
	b     bundle
	sql   *statements
	rec   *outcomes
	claim middleware.Claim

	mu    sync.Mutex
	txids map[int64]int64 // order id -> txid_current() of its last handler run
	runs  map[int64]int   // order id -> handler runs
}

func newGroupRig(t *testing.T, conns int32, consumer string) *groupRig {
	t.Helper()
	b := setup(t, 2)
	r := &groupRig{b: b, sql: &statements{}, rec: &outcomes{}, txids: map[int64]int64{}, runs: map[int64]int{}}
	st := b.storeWith(t, func(cfg *pgxpool.Config) { cfg.ConnConfig.Tracer, cfg.MaxConns = r.sql, conns })
	require.NoError(t, st.Pool().Ping(context.Background()))
	r.claim = middleware.Claim{Store: st, Consumer: consumer, Key: keyFunc(t), OnOutcome: r.rec.onOutcome, OnRetry: r.rec.onRetry}
	return r
}

// handler is the rig's handler for c: it records the transaction id,
// applies effect (credit when nil), then does what act says for the order
// (nothing when act is nil or returns nil, nil).
func (r *groupRig) handler(t *testing.T, c middleware.Claim, effect middleware.TxHandlerFunc, act func(ctx context.Context, o order) ([]*message.Message, error)) message.HandlerFunc {
	t.Helper()
	if effect == nil {
		effect = credit
	}
	return testenv.Install(t, middleware.NewClaim, c)(func(msg *message.Message) ([]*message.Message, error) {
		ctx := msg.Context()
		tx, ok := framework.TxFromContext(ctx)
		if !ok {
			return nil, framework.Permanent(framework.ErrNoClaimTx)
		}
		var o order
		if err := jsonOrder(msg, &o); err != nil {
			return nil, err
		}
		var txid int64
		if err := tx.QueryRow(ctx, "SELECT txid_current()").Scan(&txid); err != nil {
			return nil, err
		}
		r.mu.Lock()
		r.txids[o.OrderID], r.runs[o.OrderID] = txid, r.runs[o.OrderID]+1
		r.mu.Unlock()
		if err := effect(ctx, tx, msg); err != nil {
			return nil, err
		}
		if act == nil {
			return nil, nil
		}
		return act(ctx, o)
	})
}

func jsonOrder(msg *message.Message, o *order) error {
	if err := json.Unmarshal(msg.Payload, o); err != nil {
		return framework.Permanent(err)
	}
	return nil
}

// txid is the transaction id order id's handler last ran in.
func (r *groupRig) txid(id int64) int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.txids[id]
}

func (r *groupRig) handlerRuns(id int64) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.runs[id]
}

// result is the one Result the middleware reported for msg.
func (r *groupRig) result(t *testing.T, msg *message.Message) middleware.Result {
	t.Helper()
	r.rec.mu.Lock()
	defer r.rec.mu.Unlock()
	var found []middleware.Result
	for _, res := range r.rec.results {
		if res.Message == msg {
			found = append(found, res)
		}
	}
	require.Len(t, found, 1, "results of message %s", msg.UUID)
	return found[0]
}

// claimed reports whether the claim of order id exists.
func (r *groupRig) claimed(t *testing.T, id int64) bool {
	t.Helper()
	return r.b.scalar(t, "SELECT count(*) FROM "+r.b.table("processed_messages")+" WHERE consumer = $1 AND message_key = $2",
		r.claim.Consumer, fmt.Sprintf("order-completed:%d", id)) == 1
}

// queueCtx is a message context that reports the first call of Done: the
// middleware makes it in the select where it waits for a group to settle
// the message, after putting it in the group queue (and pgxpool's Acquire
// makes it on the per-message path). Nothing the middleware does for a
// message before that calls Done, so a closed queued says the message is
// waiting for the claim.
type queueCtx struct {
	context.Context
	once   sync.Once
	queued chan struct{}
}

func (c *queueCtx) Done() <-chan struct{} {
	c.once.Do(func() { close(c.queued) })
	return c.Context.Done()
}

// delivery is one message handed to the middleware on a goroutine of its
// own.
type delivery struct {
	o      order
	msg    *message.Message
	queued chan struct{}
	done   chan struct{}
	err    error
}

// deliverAsync delivers o to h under ctx on a goroutine of its own.
func deliverAsync(t *testing.T, ctx context.Context, h message.HandlerFunc, o order) *delivery {
	t.Helper()
	d := &delivery{o: o, msg: newDelivery(t, o), queued: make(chan struct{}), done: make(chan struct{})}
	d.msg.SetContext(&queueCtx{Context: ctx, queued: d.queued})
	go func() {
		defer close(d.done)
		_, d.err = h(d.msg)
	}()
	return d
}

// awaitQueued returns once d waits for the claim.
func (d *delivery) awaitQueued(t *testing.T) {
	t.Helper()
	select {
	case <-d.queued:
	case <-d.done:
		t.Fatalf("order %d returned (%v) before it waited for a group", d.o.OrderID, d.err)
	case <-time.After(groupAwait):
		t.Fatalf("order %d never waited for the claim", d.o.OrderID)
	}
}

// wait returns d's error once the middleware returned.
func (d *delivery) wait(t *testing.T) error {
	t.Helper()
	select {
	case <-d.done:
		return d.err
	case <-time.After(groupAwait):
		t.Fatalf("order %d: the middleware did not return within %v", d.o.OrderID, groupAwait)
		return nil
	}
}

func (d *delivery) returned() bool {
	select {
	case <-d.done:
		return true
	default:
		return false
	}
}

// gate holds the handlers that reach it, up to a number, until opened.
type gate struct {
	mu      sync.Mutex
	held    int
	max     int
	entered chan struct{} // closed when max handlers are held
	release chan struct{}
	once    sync.Once
}

func newGate(t *testing.T, max int) *gate {
	g := &gate{max: max, entered: make(chan struct{}), release: make(chan struct{})}
	t.Cleanup(g.open) // a failed test must not leave handlers hanging
	return g
}

func (g *gate) open() { g.once.Do(func() { close(g.release) }) }

// hold blocks the first max handlers until the gate opens; later ones
// pass.
func (g *gate) hold(ctx context.Context) error {
	g.mu.Lock()
	if g.held == g.max {
		g.mu.Unlock()
		return nil
	}
	g.held++
	if g.held == g.max {
		close(g.entered)
	}
	g.mu.Unlock()
	select {
	case <-g.release:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// openWhenQueued opens g once every one of ds waits for the claim (or
// returned): the handlers g holds keep their connections, so the others
// all queue up behind them.
func (g *gate) openWhenQueued(ds []*delivery) {
	go func() {
		for _, d := range ds {
			select {
			case <-d.queued:
			case <-d.done:
			case <-g.release:
				return
			}
		}
		g.open()
	}()
}

func (g *gate) awaitEntered(t *testing.T) {
	t.Helper()
	select {
	case <-g.entered:
	case <-time.After(groupAwait):
		t.Fatalf("the gate's %d handlers never arrived", g.max)
	}
}

// sharing counts the applied orders per transaction id.
func sharing(r *groupRig, ids []int64) map[int64]int {
	per := map[int64]int{}
	for _, id := range ids {
		per[r.txid(id)]++
	}
	return per
}

// Messages waiting for the claim at once share a transaction: 40 distinct
// messages delivered concurrently to a pool of 2 commit in far fewer
// transactions, several messages to one transaction id, no transaction
// holding more than MaxGroup; each is applied exactly once.
func TestGroupCommitSharesOneTransaction(t *testing.T) {
	t.Parallel()
	const n, conns = 40, 2
	r := newGroupRig(t, conns, "group-share")
	c := r.claim
	c.MaxGroup = 16
	// Both groups' first messages wait until every message waits for the
	// claim: the queue then holds n-conns messages, so grouping cannot
	// fail to happen for want of concurrency.
	g := newGate(t, conns)
	h := r.handler(t, c, nil, func(ctx context.Context, _ order) ([]*message.Message, error) { return nil, g.hold(ctx) })
	r.sql.take()
	var ds []*delivery
	for i := range n {
		ds = append(ds, deliverAsync(t, context.Background(), h, order{OrderID: int64(1000 + i), CustomerID: int64(1000 + i), TotalCents: 100 * int64(i+1)}))
	}
	g.openWhenQueued(ds)
	ids := make([]int64, 0, n)
	for _, d := range ds {
		require.NoError(t, d.wait(t))
		ids = append(ids, d.o.OrderID)
	}
	sql, _ := r.sql.take()
	for _, d := range ds {
		require.Equal(t, framework.Applied, r.result(t, d.msg).Outcome, "order %d", d.o.OrderID)
		require.Equal(t, int64(1), r.b.ledgerRows(t, d.o.OrderID), "order %d", d.o.OrderID)
		require.Equal(t, d.o.TotalCents/100, r.b.balance(t, d.o.CustomerID), "order %d", d.o.OrderID)
	}
	require.Equal(t, int64(n), r.b.claims(t, c.Consumer))
	commits := exactly(sql, sqlCommit)
	per := sharing(r, ids)
	largest := 0
	for _, k := range per {
		largest = max(largest, k)
	}
	t.Logf("%d messages: %d commits, %d transactions, largest group %d, %d savepoints, %d retries",
		n, commits, len(per), largest, exactly(sql, sqlSavepoint), len(r.rec.retries))
	require.Less(t, commits, n, "group commit: fewer COMMITs than messages")
	require.Equal(t, len(per), commits, "one COMMIT per transaction that applied messages")
	require.GreaterOrEqual(t, largest, 2, "several messages share a transaction id")
	require.LessOrEqual(t, largest, c.MaxGroup, "no group holds more than MaxGroup messages")
	require.Equal(t, n-commits, exactly(sql, sqlSavepoint), "every message but a group's first runs under a savepoint")
}

// In one group (a pool of 1: the first message holds the only connection
// in its handler until the others wait in the queue, in a known order), a
// message whose handler fails after its effect returns its error alone:
// its claim and effect are gone, every other message of the group is
// applied in the group's one COMMIT. The failing message is a later one
// (rolled back to its savepoint) or the group's first (the whole
// transaction rolled back; the next message begins another).
func TestGroupFailureIsolated(t *testing.T) {
	t.Parallel()
	boom := errors.New("boom")
	failures := []struct {
		name  string
		fail  func() ([]*message.Message, error)
		check func(t *testing.T, err error)
	}{
		{"error", func() ([]*message.Message, error) { return nil, boom }, func(t *testing.T, err error) {
			require.ErrorIs(t, err, boom)
			require.False(t, framework.IsPermanent(err))
		}},
		{"panic", func() ([]*message.Message, error) { panic("boom") }, func(t *testing.T, err error) {
			var pe *framework.PanicError
			require.ErrorAs(t, err, &pe)
			require.Equal(t, "boom", pe.Value)
		}},
		{"produced", func() ([]*message.Message, error) {
			return []*message.Message{message.NewMessage("produced", []byte("{}"))}, nil
		}, func(t *testing.T, err error) {
			require.ErrorIs(t, err, middleware.ErrProducedMessages)
			require.True(t, framework.IsPermanent(err))
		}},
	}
	const later = 5 // messages queued behind the first
	for _, f := range failures {
		for _, failing := range []int{3, 0} { // a later message; the group's first
			t.Run(fmt.Sprintf("%s/step%d", f.name, failing), func(t *testing.T) {
				t.Parallel()
				r := newGroupRig(t, 1, "group-iso")
				c := r.claim
				c.MaxGroupTime = time.Minute // one group, however long the first is held
				g := newGate(t, 1)
				orders := make([]order, later+1)
				for i := range orders {
					orders[i] = order{OrderID: int64(100 + i), CustomerID: int64(100 + i), TotalCents: 1000 * int64(i+1)}
				}
				h := r.handler(t, c, nil, func(ctx context.Context, o order) ([]*message.Message, error) {
					if o.OrderID == orders[0].OrderID {
						if err := g.hold(ctx); err != nil {
							return nil, err
						}
					}
					if o.OrderID == orders[failing].OrderID {
						return f.fail()
					}
					return nil, nil
				})
				r.sql.take()
				ds := []*delivery{deliverAsync(t, context.Background(), h, orders[0])}
				g.awaitEntered(t)
				for _, o := range orders[1:] {
					d := deliverAsync(t, context.Background(), h, o)
					d.awaitQueued(t)
					ds = append(ds, d)
				}
				g.open()
				var applied []int64
				for i, d := range ds {
					err := d.wait(t)
					res := r.result(t, d.msg)
					require.Equal(t, 1, res.Attempts, "order %d: settled by its group, not retried alone", d.o.OrderID)
					require.Equal(t, 1, r.handlerRuns(d.o.OrderID), "order %d: handler runs", d.o.OrderID)
					if i == failing {
						f.check(t, err)
						require.Equal(t, framework.Failed, res.Outcome)
						require.Equal(t, err, res.Err)
						require.False(t, r.claimed(t, d.o.OrderID), "the failed message's claim is rolled back")
						require.Zero(t, r.b.ledgerRows(t, d.o.OrderID), "the failed message's effect is rolled back")
						require.Zero(t, r.b.balance(t, d.o.CustomerID), "the failed message's effect is rolled back")
						continue
					}
					require.NoError(t, err, "order %d", d.o.OrderID)
					require.Equal(t, framework.Applied, res.Outcome, "order %d", d.o.OrderID)
					require.True(t, r.claimed(t, d.o.OrderID), "order %d", d.o.OrderID)
					require.Equal(t, int64(1), r.b.ledgerRows(t, d.o.OrderID), "order %d", d.o.OrderID)
					require.Equal(t, d.o.TotalCents/100, r.b.balance(t, d.o.CustomerID), "order %d", d.o.OrderID)
					applied = append(applied, d.o.OrderID)
				}
				require.Equal(t, int64(later), r.b.claims(t, c.Consumer))
				require.Len(t, sharing(r, applied), 1, "the applied messages committed in one transaction")
				sql, _ := r.sql.take()
				require.Equal(t, 1, exactly(sql, sqlCommit), "one COMMIT: %q", sql)
				if failing == 0 {
					// The first's whole transaction went; the next message
					// began the group's transaction, the rest under savepoints.
					require.Equal(t, later-1, exactly(sql, sqlSavepoint), "%q", sql)
					require.Zero(t, exactly(sql, sqlRollbackTo), "%q", sql)
				} else {
					require.Equal(t, later, exactly(sql, sqlSavepoint), "every later message under a savepoint: %q", sql)
					require.Equal(t, 1, exactly(sql, sqlRollbackTo), "only the failed step rolled back: %q", sql)
				}
			})
		}
	}
}

// Two copies of one message (fresh UUIDs, one key) in one group: the
// second meets the first's claim in the group's own transaction and is a
// Duplicate, the effect made once. When the first copy's handler fails,
// its claim goes with its savepoint and the second copy takes over. The
// first copy is a later step of the group or the group's first.
func TestGroupTwinsInOneGroup(t *testing.T) {
	t.Parallel()
	boom := errors.New("boom")
	for _, firstFails := range []bool{false, true} {
		for _, twinFirst := range []bool{false, true} {
			t.Run(fmt.Sprintf("firstFails=%v/twinIsGroupFirst=%v", firstFails, twinFirst), func(t *testing.T) {
				t.Parallel()
				r := newGroupRig(t, 1, "group-twins")
				c := r.claim
				c.MaxGroupTime = time.Minute
				g := newGate(t, 1)
				twin := order{OrderID: 7, CustomerID: 7, TotalCents: 1500}
				other := order{OrderID: 8, CustomerID: 8, TotalCents: 2500}
				blocker := other
				if twinFirst {
					blocker = twin
				}
				var twinRuns atomic.Int32
				h := r.handler(t, c, nil, func(ctx context.Context, o order) ([]*message.Message, error) {
					var err error
					if o.OrderID == blocker.OrderID {
						err = g.hold(ctx)
					}
					if o.OrderID == twin.OrderID && twinRuns.Add(1) == 1 && firstFails {
						err = boom
					}
					return nil, err
				})
				r.sql.take()
				first := deliverAsync(t, context.Background(), h, blocker)
				g.awaitEntered(t)
				var ds, copies []*delivery
				queue := []order{twin, twin}
				if twinFirst {
					copies = append(copies, first)
					queue = []order{twin, other}
				} else {
					ds = append(ds, first)
				}
				for _, o := range queue {
					d := deliverAsync(t, context.Background(), h, o)
					d.awaitQueued(t)
					if o == twin {
						copies = append(copies, d)
					} else {
						ds = append(ds, d)
					}
				}
				g.open()
				require.Len(t, copies, 2)
				require.Len(t, ds, 1)
				require.NoError(t, ds[0].wait(t))
				require.Equal(t, framework.Applied, r.result(t, ds[0].msg).Outcome)
				errA, errB := copies[0].wait(t), copies[1].wait(t)
				resA, resB := r.result(t, copies[0].msg), r.result(t, copies[1].msg)
				require.NoError(t, errB)
				if firstFails {
					require.ErrorIs(t, errA, boom)
					require.Equal(t, framework.Failed, resA.Outcome)
					require.Equal(t, framework.Applied, resB.Outcome, "the second copy takes over")
					require.Equal(t, int32(2), twinRuns.Load())
				} else {
					require.NoError(t, errA)
					require.Equal(t, framework.Applied, resA.Outcome)
					require.Equal(t, framework.Duplicate, resB.Outcome)
					require.Equal(t, int32(1), twinRuns.Load(), "the duplicate's handler does not run")
				}
				require.Equal(t, 1, resA.Attempts)
				require.Equal(t, 1, resB.Attempts, "settled in the group, not alone")
				require.Equal(t, int64(1), r.b.ledgerRows(t, twin.OrderID), "effect once")
				require.Equal(t, twin.TotalCents/100, r.b.balance(t, twin.CustomerID))
				require.Equal(t, int64(1), r.b.ledgerRows(t, other.OrderID))
				require.Equal(t, int64(2), r.b.claims(t, c.Consumer))
				require.Equal(t, r.txid(twin.OrderID), r.txid(other.OrderID), "one transaction")
				sql, _ := r.sql.take()
				require.Equal(t, 1, exactly(sql, sqlCommit), "one COMMIT: %q", sql)
				require.Empty(t, r.rec.retries)
			})
		}
	}
}

// Hot rows locked in message-dependent order: groups (whose later steps
// hold the earlier steps' locks) and lone transactions deadlock and time
// out on each other's locks. Each such message must leave its group and
// be retried alone, so that every message is applied exactly once, no
// error reaches the router and the run ends instead of collapsing into
// waits.
func TestGroupHotKeysNoDeadlockCollapse(t *testing.T) {
	t.Parallel()
	const workers, messages, customers, conns = 16, 1000, 10, 8
	r := newGroupRig(t, conns, "group-hot")
	for cu := range customers {
		r.b.exec(t, "INSERT INTO balances (customer_id, points) VALUES ($1, 0)", cu)
	}
	// pair is the two customers order id credits, in the order it locks
	// them: both orders occur for every pair.
	pair := func(id int64) (int64, int64) {
		rnd := rand.New(rand.NewPCG(uint64(id), 42))
		a := rnd.Int64N(customers)
		return a, (a + 1 + rnd.Int64N(customers-1)) % customers
	}
	twoRows := func(ctx context.Context, tx pgx.Tx, msg *message.Message) error {
		var o order
		if err := jsonOrder(msg, &o); err != nil {
			return err
		}
		a, b := pair(o.OrderID)
		for _, cu := range []int64{a, b} {
			if _, err := tx.Exec(ctx, "UPDATE balances SET points = points + $2 WHERE customer_id = $1", cu, o.TotalCents); err != nil {
				return err
			}
		}
		_, err := tx.Exec(ctx, "INSERT INTO point_ledger (customer_id, order_id, points) VALUES ($1, $2, $3)", a, o.OrderID, o.TotalCents)
		return err
	}
	h := r.handler(t, r.claim, twoRows, nil)
	want := make([]int64, customers)
	for id := range int64(messages) {
		a, b := pair(id)
		want[a] += id + 1
		want[b] += id + 1
	}
	msgs := make([]*message.Message, messages)
	for id := range msgs {
		msgs[id] = newDelivery(t, order{OrderID: int64(id), CustomerID: -1, TotalCents: int64(id) + 1})
	}
	r.sql.take()
	start := time.Now()
	errs := make(chan error, messages)
	done := make(chan struct{})
	go func() {
		defer close(done)
		var wg sync.WaitGroup
		for w := range workers {
			wg.Go(func() {
				for id := w; id < messages; id += workers {
					if _, err := h(msgs[id]); err != nil {
						errs <- fmt.Errorf("order %d: %w", id, err)
					}
				}
			})
		}
		wg.Wait()
	}()
	require.Eventually(t, func() bool {
		select {
		case <-done:
			return true
		default:
			return false
		}
	}, 5*time.Minute, 20*time.Millisecond, "the deliveries did not finish")
	elapsed := time.Since(start)
	close(errs)
	for err := range errs {
		require.NoError(t, err, "no error may surface to the router")
	}
	sql, _ := r.sql.take()
	ids := make([]int64, messages)
	for i := range ids {
		ids[i] = int64(i)
	}
	per := sharing(r, ids)
	largest, grouped := 0, 0
	for _, k := range per {
		largest = max(largest, k)
		if k > 1 {
			grouped += k
		}
	}
	causes := map[string]int{}
	for _, rt := range r.rec.retries {
		causes[rt.Cause]++
	}
	t.Logf("%d messages in %v: %d transactions (%d messages shared one, largest %d), %d commits, %d later steps left their group (ROLLBACK TO), retries %v",
		messages, elapsed.Round(time.Millisecond), len(per), grouped, largest, exactly(sql, sqlCommit), exactly(sql, sqlRollbackTo), causes)
	require.Equal(t, messages, r.rec.count(framework.Applied))
	require.Equal(t, messages, len(r.rec.results), "one pass per message")
	require.Equal(t, int64(messages), r.b.claims(t, r.claim.Consumer))
	require.Equal(t, int64(messages), r.b.scalar(t, "SELECT count(*) FROM point_ledger"))
	require.Equal(t, int64(messages), r.b.scalar(t, "SELECT count(DISTINCT order_id) FROM point_ledger"))
	for cu, w := range want {
		require.Equal(t, w, r.b.balance(t, int64(cu)), "customer %d", cu)
	}
	require.LessOrEqual(t, largest, 16)
}

// MaxGroup 1, and an isolation other than READ COMMITTED, run every
// message in a transaction of its own: no savepoint, one COMMIT and one
// transaction id per message, under the same concurrency that groups the
// control's messages.
func TestGroupDisabled(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		edit    func(*middleware.Claim)
		grouped bool
	}{
		{"MaxGroup=1", func(c *middleware.Claim) { c.MaxGroup = 1 }, false},
		{"SERIALIZABLE", func(c *middleware.Claim) { c.Isolation = pgx.Serializable }, false},
		{"REPEATABLE READ", func(c *middleware.Claim) { c.Isolation = pgx.RepeatableRead }, false},
		{"control", func(*middleware.Claim) {}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			const n, conns = 12, 2
			r := newGroupRig(t, conns, "group-off")
			c := r.claim
			c.MaxGroupTime = time.Minute
			c.MaxAttempts = 20 // SERIALIZABLE: the credits' index reads conflict
			tc.edit(&c)
			g := newGate(t, conns)
			h := r.handler(t, c, nil, func(ctx context.Context, _ order) ([]*message.Message, error) { return nil, g.hold(ctx) })
			r.sql.take()
			var ds []*delivery
			for i := range n {
				ds = append(ds, deliverAsync(t, context.Background(), h, order{OrderID: int64(200 + i), CustomerID: int64(200 + i), TotalCents: 1000}))
			}
			g.openWhenQueued(ds)
			var ids []int64
			for _, d := range ds {
				require.NoError(t, d.wait(t), "order %d", d.o.OrderID)
				require.Equal(t, framework.Applied, r.result(t, d.msg).Outcome)
				require.Equal(t, int64(1), r.b.ledgerRows(t, d.o.OrderID))
				ids = append(ids, d.o.OrderID)
			}
			sql, _ := r.sql.take()
			per := sharing(r, ids)
			t.Logf("%s: %d transactions, %d commits, %d savepoints, %d retries", tc.name, len(per), exactly(sql, sqlCommit), exactly(sql, sqlSavepoint), len(r.rec.retries))
			if tc.grouped {
				require.Positive(t, exactly(sql, sqlSavepoint), "the control groups: %q", sql)
				require.Less(t, len(per), n)
				return
			}
			require.Zero(t, mentioning(sql, "SAVEPOINT"), "%q", sql)
			require.Len(t, per, n, "a transaction id per message")
			commits := exactly(sql, sqlCommit)
			if c.Isolation == pgx.Serializable {
				require.GreaterOrEqual(t, commits, n, "%q", sql) // a COMMIT may fail with 40001 and be retried
			} else {
				require.Equal(t, n, commits, "a COMMIT per message: %q", sql)
			}
			require.Equal(t, n+len(r.rec.retries), mentioning(sql, "begin"), "a BEGIN per attempt: %q", sql)
		})
	}
}

// NewClaim refuses a MaxGroup outside 0…64 and a negative MaxGroupTime,
// naming the field; the bounds themselves are accepted.
func TestGroupConfigRefused(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	for _, tc := range []struct {
		field string
		edit  func(*middleware.Claim)
	}{
		{"MaxGroup", func(c *middleware.Claim) { c.MaxGroup = -1 }},
		{"MaxGroup", func(c *middleware.Claim) { c.MaxGroup = 65 }},
		{"MaxGroupTime", func(c *middleware.Claim) { c.MaxGroupTime = -1 }},
		{"MaxGroupTime", func(c *middleware.Claim) { c.MaxGroupTime = -time.Second }},
	} {
		c := b.claim(t, "group-config", nil)
		tc.edit(&c)
		err := configErr(middleware.NewClaim, c)
		var ce *framework.ConfigError
		require.ErrorAs(t, err, &ce, "%+v", c)
		require.Equal(t, tc.field, ce.Field)
		_, err = middleware.NewBatch(c)
		require.ErrorAs(t, err, &ce, "NewBatch validates the same claim")
		require.Equal(t, tc.field, ce.Field)
	}
	for _, ok := range []func(*middleware.Claim){
		func(c *middleware.Claim) { c.MaxGroup = 0 },
		func(c *middleware.Claim) { c.MaxGroup = 1 },
		func(c *middleware.Claim) { c.MaxGroup = 64 },
		func(c *middleware.Claim) { c.MaxGroupTime = time.Nanosecond },
	} {
		c := b.claim(t, "group-config", nil)
		ok(&c)
		require.NoError(t, configErr(middleware.NewClaim, c))
	}
}

// heldGroup installs r's claim around a handler that holds order id in a
// gate until the gate opens, delivers that order, and returns once its
// handler holds: the group it leads stays busy.
func heldGroup(t *testing.T, r *groupRig, id int64) (message.HandlerFunc, *delivery, *gate) {
	g := newGate(t, 1)
	h := r.handler(t, r.claim, nil, func(ctx context.Context, o order) ([]*message.Message, error) {
		if o.OrderID == id {
			return nil, g.hold(ctx)
		}
		return nil, nil
	})
	first := deliverAsync(t, context.Background(), h, order{OrderID: id, CustomerID: id, TotalCents: 1000})
	g.awaitEntered(t)
	return h, first, g
}

// A message whose context ends while it waits behind a busy group (a pool
// of 1, its one group held in a handler) returns at once with the
// context's error, its handler never run and nothing of it applied; the
// group is not disturbed.
func TestGroupCancelWhileQueued(t *testing.T) {
	t.Parallel()
	r := newGroupRig(t, 1, "group-cancel")
	h, first, g := heldGroup(t, r, 300)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	queued := deliverAsync(t, ctx, h, order{OrderID: 301, CustomerID: 301, TotalCents: 1000})
	queued.awaitQueued(t)
	cancel()
	err := queued.wait(t)
	require.False(t, first.returned(), "the queued message returned while its group's first still ran")
	require.ErrorIs(t, err, context.Canceled)
	res := r.result(t, queued.msg)
	require.Equal(t, framework.Failed, res.Outcome)
	require.Zero(t, r.handlerRuns(301), "the cancelled message's handler never ran")
	g.open()
	require.NoError(t, first.wait(t))
	require.Equal(t, framework.Applied, r.result(t, first.msg).Outcome)
	require.True(t, r.claimed(t, 300))
	require.False(t, r.claimed(t, 301))
	require.Zero(t, r.b.ledgerRows(t, 301))
	require.Equal(t, int64(1), r.b.claims(t, r.claim.Consumer))
}

// A message waits in the queue only while every group is busy: with a
// pool of 2 and one group held in a handler, the next message starts a
// group of its own and is applied meanwhile.
func TestGroupIdleConnectionStartsGroup(t *testing.T) {
	t.Parallel()
	r := newGroupRig(t, 2, "group-idle")
	h, first, g := heldGroup(t, r, 400)
	next := deliverAsync(t, context.Background(), h, order{OrderID: 401, CustomerID: 401, TotalCents: 1000})
	require.NoError(t, next.wait(t))
	require.False(t, first.returned())
	require.Equal(t, framework.Applied, r.result(t, next.msg).Outcome)
	require.Equal(t, int64(1), r.b.ledgerRows(t, 401), "committed while the other group runs")
	g.open()
	require.NoError(t, first.wait(t))
	require.NotEqual(t, r.txid(400), r.txid(401))
}

// In ModeNaturalKey, a later copy that finds its effect's row made by an
// earlier step of its own group (framework.ErrAlreadyApplied) is a
// Duplicate once the group commits; when the COMMIT fails (a deferred
// constraint refuses the effect at commit), the effect does not exist and
// that copy must not be acked as a Duplicate of it: it fails as the first
// copy does.
func TestGroupNaturalKeyTwinAwaitsCommit(t *testing.T) {
	t.Parallel()
	for _, refuse := range []bool{false, true} {
		t.Run(fmt.Sprintf("refusedAtCommit=%v", refuse), func(t *testing.T) {
			t.Parallel()
			r := newGroupRig(t, 1, "group-natural")
			r.b.exec(t, "ALTER TABLE point_ledger ADD CONSTRAINT one_credit_per_order UNIQUE (order_id)")
			if refuse {
				r.b.exec(t, `CREATE FUNCTION refuse_order() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN RAISE EXCEPTION 'order % refused at commit', NEW.order_id; END $$`)
				r.b.exec(t, `CREATE CONSTRAINT TRIGGER refuse_at_commit AFTER INSERT ON point_ledger
DEFERRABLE INITIALLY DEFERRED FOR EACH ROW WHEN (NEW.order_id = 9) EXECUTE FUNCTION refuse_order()`)
			}
			c := r.claim
			c.Mode, c.MaxGroupTime = middleware.ModeNaturalKey, time.Minute
			g := newGate(t, 1)
			busy := order{OrderID: 10, CustomerID: 10, TotalCents: 1000}
			twin := order{OrderID: 9, CustomerID: 9, TotalCents: 1000}
			h := r.handler(t, c, creditOnce, func(ctx context.Context, o order) ([]*message.Message, error) {
				if o.OrderID == busy.OrderID {
					return nil, g.hold(ctx)
				}
				return nil, nil
			})
			r.sql.take()
			first := deliverAsync(t, context.Background(), h, busy)
			g.awaitEntered(t)
			a := deliverAsync(t, context.Background(), h, twin)
			a.awaitQueued(t)
			b := deliverAsync(t, context.Background(), h, twin)
			b.awaitQueued(t)
			g.open()
			require.NoError(t, first.wait(t))
			require.Equal(t, framework.Applied, r.result(t, first.msg).Outcome)
			require.Equal(t, int64(1), r.b.ledgerRows(t, busy.OrderID))
			errA, errB := a.wait(t), b.wait(t)
			resA, resB := r.result(t, a.msg), r.result(t, b.msg)
			if !refuse {
				require.NoError(t, errA)
				require.NoError(t, errB)
				require.Equal(t, framework.Applied, resA.Outcome)
				require.Equal(t, framework.Duplicate, resB.Outcome)
				require.Equal(t, int64(1), r.b.ledgerRows(t, twin.OrderID))
				require.Equal(t, twin.TotalCents/100, r.b.balance(t, twin.CustomerID))
				require.Equal(t, r.txid(busy.OrderID), r.txid(twin.OrderID), "one group")
				sql, _ := r.sql.take()
				require.Equal(t, 1, exactly(sql, sqlCommit), "%q", sql)
				return
			}
			require.ErrorContains(t, errA, "refused at commit")
			require.Zero(t, r.b.ledgerRows(t, twin.OrderID), "the effect was never committed")
			require.NotEqual(t, framework.Duplicate, resB.Outcome, "acked as a duplicate of an effect that does not exist")
			require.ErrorContains(t, errB, "refused at commit")
		})
	}
}
