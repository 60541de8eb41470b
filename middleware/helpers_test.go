package middleware_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/internal/pg"
	"github.com/claimtx/claimtx/internal/testenv"
	"github.com/claimtx/claimtx/middleware"
	"github.com/claimtx/claimtx/store"
)

// bundle is what each test gets: its own schema holding claimtx's tables and
// the loyalty effect tables of the seed.
type bundle struct {
	pool   *pgxpool.Pool
	store  *store.Store
	schema string
}

func setup(t testing.TB, maxConns int32) bundle {
	t.Helper()
	st := testenv.Migrated(t, maxConns)
	b := bundle{pool: st.Pool(), store: st, schema: st.Config().Schema}
	b.exec(t, `
CREATE TABLE balances (customer_id bigint PRIMARY KEY, points bigint NOT NULL);
CREATE TABLE point_ledger (customer_id bigint NOT NULL, order_id bigint NOT NULL, points bigint NOT NULL)`)
	return b
}

type order struct {
	OrderID    int64 `json:"order_id"`
	CustomerID int64 `json:"customer_id"`
	TotalCents int64 `json:"total_cents"`
}

// newDelivery builds a fresh Watermill message for an order, as a broker
// redelivery or republish would: new UUID, same producer-fixed content.
func newDelivery(t testing.TB, o order) *message.Message {
	t.Helper()
	payload, err := json.Marshal(o)
	require.NoError(t, err)
	msg := testenv.Message(string(payload), "event_id", fmt.Sprintf("evt-%d", o.OrderID))
	msg.SetContext(context.Background())
	return msg
}

// credit is the seed's loyalty effect, written through the claim tx.
func credit(ctx context.Context, tx pgx.Tx, msg *message.Message) error {
	var o order
	if err := json.Unmarshal(msg.Payload, &o); err != nil {
		return framework.Permanent(err)
	}
	points := o.TotalCents / 100
	if _, err := tx.Exec(ctx, `INSERT INTO balances (customer_id, points) VALUES ($1, $2)
		ON CONFLICT (customer_id) DO UPDATE SET points = balances.points + EXCLUDED.points`, o.CustomerID, points); err != nil {
		return err
	}
	_, err := tx.Exec(ctx, `INSERT INTO point_ledger (customer_id, order_id, points) VALUES ($1, $2, $3)`, o.CustomerID, o.OrderID, points)
	return err
}

// creditSetSQL is credit for many orders in one statement: the ledger rows
// and the balance increments, the balances inserted or locked in
// customer order so concurrent batches queue instead of deadlocking.
const creditSetSQL = `WITH o AS (
	SELECT * FROM unnest($1::bigint[], $2::bigint[], $3::bigint[]) AS o(customer_id, order_id, points)
), ledger AS (
	INSERT INTO point_ledger (customer_id, order_id, points) SELECT customer_id, order_id, points FROM o
)
INSERT INTO balances (customer_id, points)
SELECT customer_id, sum(points) FROM o GROUP BY customer_id ORDER BY customer_id
ON CONFLICT (customer_id) DO UPDATE SET points = balances.points + EXCLUDED.points`

// creditSet is the set-wise credit: one round trip for all of msgs.
func creditSet(ctx context.Context, tx pgx.Tx, msgs []*message.Message) error {
	var customers, orders, points []int64
	for _, msg := range msgs {
		var o order
		if err := json.Unmarshal(msg.Payload, &o); err != nil {
			return framework.Permanent(err)
		}
		customers, orders, points = append(customers, o.CustomerID), append(orders, o.OrderID), append(points, o.TotalCents/100)
	}
	_, err := tx.Exec(ctx, creditSetSQL, customers, orders, points)
	return err
}

func keyFunc(t testing.TB) framework.KeyFunc {
	t.Helper()
	return mustKeySpec(t, "template:order-completed:{payload.order_id}")
}

// mustKeySpec parses spec, failing the test if it does not parse.
func mustKeySpec(t testing.TB, spec string) framework.KeyFunc {
	t.Helper()
	kf, err := framework.ParseKeySpec(spec)
	require.NoError(t, err)
	return kf
}

// outcomes records every Result the middleware reports.
type outcomes struct {
	mu      sync.Mutex
	results []middleware.Result
	retries []middleware.TxRetry
}

// requireSerializationRetries checks that under SERIALIZABLE some twins hit
// 40001 and were retried: otherwise a twins test did not exercise what it
// claims to.
func (o *outcomes) requireSerializationRetries(t testing.TB) {
	t.Helper()
	o.mu.Lock()
	defer o.mu.Unlock()
	require.NotEmpty(t, o.retries, "expected serialization failures to be retried")
	for _, r := range o.retries {
		require.Equal(t, "serialization", r.Cause, "retry cause: %v", r.Err)
	}
}

// requireFirst checks the outcomes of the first len(want) results.
func (o *outcomes) requireFirst(t testing.TB, want ...framework.Outcome) {
	t.Helper()
	o.mu.Lock()
	defer o.mu.Unlock()
	require.GreaterOrEqual(t, len(o.results), len(want))
	got := make([]framework.Outcome, len(want))
	for i := range want {
		got[i] = o.results[i].Outcome
	}
	require.Equal(t, want, got)
}

func (o *outcomes) onOutcome(r middleware.Result) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.results = append(o.results, r)
}

func (o *outcomes) onRetry(r middleware.TxRetry) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.retries = append(o.retries, r)
}

func (o *outcomes) count(out framework.Outcome) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	n := 0
	for _, r := range o.results {
		if r.Outcome == out {
			n++
		}
	}
	return n
}

func (b bundle) claim(t testing.TB, consumer string, rec *outcomes) middleware.Claim {
	c := middleware.Claim{Store: b.store, Consumer: consumer, Key: keyFunc(t), MaxGroup: testenv.MaxGroup()}
	if rec != nil {
		c.OnOutcome = rec.onOutcome
		c.OnRetry = rec.onRetry
	}
	require.NoError(t, configErr(middleware.NewClaim, c))
	return c
}

// exec runs sql on the test's pool, failing the test on an error.
func (b bundle) exec(t testing.TB, sql string, args ...any) {
	t.Helper()
	_, err := b.pool.Exec(context.Background(), sql, args...)
	require.NoError(t, err)
}

// table is the quoted name of the test schema's table name.
func (b bundle) table(name string) string { return pgx.Identifier{b.schema, name}.Sanitize() }

// names are the test schema's claimtx tables, under the default names.
func (b bundle) names() *pg.Names { return pg.NewNames(b.schema, "processed_messages", "outbox") }

// storeWith is a store of the test schema on a pool of its own whose
// configuration edit changed first (another user, a tracer).
func (b bundle) storeWith(t testing.TB, edit func(*pgxpool.Config)) *store.Store {
	t.Helper()
	url, err := testenv.URLWithSearchPath(b.schema)
	require.NoError(t, err)
	cfg, err := pgxpool.ParseConfig(url)
	require.NoError(t, err)
	edit(cfg)
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	st, err := store.New(pool, store.Config{Schema: b.schema})
	require.NoError(t, err)
	return st
}

func (b bundle) scalar(t testing.TB, sql string, args ...any) int64 {
	t.Helper()
	return testenv.Scalar(t, b.pool, sql, args...)
}

func (b bundle) balance(t testing.TB, customer int64) int64 {
	return b.scalar(t, "SELECT coalesce(sum(points), 0) FROM balances WHERE customer_id = $1", customer)
}

func (b bundle) ledgerRows(t testing.TB, orderID int64) int64 {
	return b.scalar(t, "SELECT count(*) FROM point_ledger WHERE order_id = $1", orderID)
}

func (b bundle) claims(t testing.TB, consumer string) int64 {
	return b.scalar(t, "SELECT count(*) FROM "+b.table("processed_messages")+" WHERE consumer = $1", consumer)
}

// consume turns a typed handler into a HandlerFunc that tests can wrap with
// the NewClaim middleware and call directly, one delivery per call.
func consume(fn middleware.TxHandlerFunc) message.HandlerFunc {
	h := middleware.TxHandler(fn)
	return func(msg *message.Message) ([]*message.Message, error) { return nil, h(msg) }
}

// failAfter runs effect and then, while *fail is set, returns (or panics
// with) failure(): a failure after the effect, which must roll back with
// the claim.
func failAfter(effect middleware.TxHandlerFunc, fail *bool, failure func() error) middleware.TxHandlerFunc {
	return func(ctx context.Context, tx pgx.Tx, msg *message.Message) error {
		if err := effect(ctx, tx, msg); err != nil {
			return err
		}
		if *fail {
			return failure()
		}
		return nil
	}
}

// requireRetryApplies redelivers o to h, whose first delivery failed, and
// checks that this one applied: the customer holds the order's points.
func (b bundle) requireRetryApplies(t testing.TB, h message.HandlerFunc, rec *outcomes, o order) {
	t.Helper()
	_, err := h(newDelivery(t, o))
	require.NoError(t, err)
	rec.requireFirst(t, framework.Failed, framework.Applied)
	require.Equal(t, o.TotalCents/100, b.balance(t, o.CustomerID))
}

// inParallel runs work(0) … work(n-1) at once and requires that none of
// them returned an error.
func inParallel(t testing.TB, n int, work func(w int) []error) {
	t.Helper()
	errs := make([][]error, n)
	var wg sync.WaitGroup
	for w := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[w] = work(w)
		}()
	}
	wg.Wait()
	for _, e := range errs {
		for _, err := range e {
			require.NoError(t, err)
		}
	}
}

// hold opens a transaction that is rolled back when the test ends, if not
// before: a twin still in flight, holding what it wrote.
func (b bundle) hold(t testing.TB) pgx.Tx {
	t.Helper()
	tx := testenv.Begin(t, b.pool)
	return tx
}

// holdClaim is hold with consumer's claim of key made, and so held, in it.
func (b bundle) holdClaim(t testing.TB, consumer, key string) pgx.Tx {
	t.Helper()
	tx := b.hold(t)
	claimed, err := b.store.Claim(context.Background(), tx, store.ClaimRequest{Consumer: consumer, Key: key})
	require.NoError(t, err)
	require.True(t, claimed.New)
	return tx
}

// requireClaimWait checks that err is a claim wait given up after its
// bound: a failure to retry, not a permanent one.
func requireClaimWait(t testing.TB, err error) {
	t.Helper()
	require.Error(t, err)
	require.Equal(t, pg.ClaimWait, pg.Classify(err))
	require.False(t, framework.IsPermanent(err))
}

// deadLetters is a persistent in-process "orders.poison" topic for a
// Poison middleware to publish to, subscribed from the start.
type deadLetters struct {
	*gochannel.GoChannel
	copies <-chan *message.Message
}

func newDeadLetters(t testing.TB) deadLetters {
	t.Helper()
	pubsub := gochannel.NewGoChannel(gochannel.Config{Persistent: true}, nil)
	t.Cleanup(func() { _ = pubsub.Close() })
	copies, err := pubsub.Subscribe(context.Background(), "orders.poison")
	require.NoError(t, err)
	return deadLetters{pubsub, copies}
}

// next takes the next poisoned copy, acked; none within 5 seconds fails
// the test with why.
func (d deadLetters) next(t testing.TB, why string) *message.Message {
	t.Helper()
	select {
	case m := <-d.copies:
		m.Ack()
		return m
	case <-time.After(5 * time.Second):
		t.Fatal(why)
		return nil
	}
}

// deliverTwins delivers n copies of one order to wrap(effect) at once, each
// on its own open connection, and checks that exactly one applied and no
// error reached the router.
//
// The twins must really meet on the uncommitted claim, or these tests would
// pass just as well if the deliveries ran one after another. So the first
// effect to run (the winner's: it holds the claim, or in natural-key mode
// the guarded row it just inserted) keeps its transaction open until
// Postgres shows the n-1 other twins waiting on a lock its backend holds,
// and the test fails if that never happens within twinOverlapTimeout. A
// sequential run cannot pass: when the first delivery's effect runs, no
// other twin exists yet to wait behind it.
func deliverTwins(t *testing.T, b bundle, wrap func(message.HandlerFunc) message.HandlerFunc, effect middleware.TxHandlerFunc, rec *outcomes, n int) {
	t.Helper()
	o := order{OrderID: 9913, CustomerID: 8, TotalCents: 1000}
	warm(t, b.pool, n)
	var gate overlapGate
	h := wrap(consume(func(ctx context.Context, tx pgx.Tx, msg *message.Message) error {
		if err := effect(ctx, tx, msg); err != nil {
			return err
		}
		return gate.await(ctx, tx, n-1)
	}))
	msgs := make([]*message.Message, n)
	for i := range msgs {
		msgs[i] = newDelivery(t, o)
	}
	start := make(chan struct{})
	errs := make(chan error, n)
	var wg sync.WaitGroup
	for _, msg := range msgs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			_, err := h(msg)
			errs <- err
		}()
	}
	close(start)
	wg.Wait()
	close(errs)
	gate.mu.Lock()
	entered, waiting, gateErr := gate.entered, gate.waiting, gate.err
	gate.mu.Unlock()
	require.True(t, entered, "no twin's effect ran")
	require.NoError(t, gateErr, "the twins did not overlap: %d of %d were seen waiting behind the winner", waiting, n-1)
	require.Equal(t, n-1, waiting, "twins waiting behind the winner")
	for err := range errs {
		require.NoError(t, err, "no error may surface to the router")
	}
	require.Equal(t, 1, rec.count(framework.Applied))
	require.Equal(t, n-1, rec.count(framework.Duplicate))
	require.Equal(t, int64(10), b.balance(t, 8))
	require.Equal(t, int64(1), b.ledgerRows(t, 9913))
}

// twinOverlapTimeout bounds how long the winner waits for its twins to
// queue behind it: long enough for 64 goroutines to reach a loaded shared
// server, short enough to fail a broken run promptly. Twins that give up
// their lock wait meanwhile (MaxClaimWait) are retried and queue again.
const twinOverlapTimeout = 30 * time.Second

// blockedBehindMeSQL counts the backends waiting on a lock held by this
// backend, directly or behind another such waiter (a waiter queued behind
// a first one on a tuple lock is blocked by that waiter, not by the
// holder). Only backends that wait on some lock are examined, so the poll
// stays cheap on a shared server. pg_locks, unlike pg_stat_activity, is
// not cached for the rest of the transaction, so each poll sees the
// present. Only this test's role in this database counts: behind a pooler
// each test schema has a role of its own, and another test's backend
// queued behind one of ours once made it 8 of 7 twins. pg_stat_activity is
// cached per transaction: the gate clears that snapshot before each poll.
const blockedBehindMeSQL = `WITH RECURSIVE waiting AS (
	SELECT DISTINCT l.pid FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
	WHERE NOT l.granted AND a.usename = current_user AND a.datname = current_database()
), behind(pid) AS (
	SELECT pid FROM waiting WHERE pg_backend_pid() = ANY(pg_blocking_pids(pid))
	UNION
	SELECT w.pid FROM waiting w JOIN behind b ON b.pid = ANY(pg_blocking_pids(w.pid))
)
SELECT count(*) FROM behind`

// overlapGate holds the first effect that reaches it until the given
// number of twins wait behind its transaction; later effects pass through
// (a retried winner must not wait for twins that already settled).
type overlapGate struct {
	mu      sync.Mutex
	entered bool
	waiting int
	err     error
}

func (g *overlapGate) await(ctx context.Context, tx pgx.Tx, want int) error {
	g.mu.Lock()
	first := !g.entered
	g.entered = true
	g.mu.Unlock()
	if !first {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, twinOverlapTimeout)
	defer cancel()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	var seen int
	for {
		_, err := tx.Exec(ctx, "SELECT pg_stat_clear_snapshot()")
		if err == nil {
			err = tx.QueryRow(ctx, blockedBehindMeSQL).Scan(&seen)
		}
		if err == nil && seen < want {
			select {
			case <-tick.C:
				continue
			case <-ctx.Done():
			}
		}
		if ctx.Err() != nil {
			err = fmt.Errorf("after %v only %d of %d twins waited behind the winner: %w", twinOverlapTimeout, seen, want, ctx.Err())
		}
		g.mu.Lock()
		g.waiting, g.err = seen, err
		g.mu.Unlock()
		if err != nil {
			// Permanent: a retry would pass the gate without proving anything.
			return framework.Permanent(err)
		}
		return nil
	}
}

// warm opens n connections so that every twin starts on its own.
func warm(t *testing.T, pool *pgxpool.Pool, n int) {
	t.Helper()
	conns := make([]*pgxpool.Conn, 0, n)
	for i := 0; i < n; i++ {
		c, err := pool.Acquire(context.Background())
		require.NoError(t, err)
		conns = append(conns, c)
	}
	for _, c := range conns {
		c.Release()
	}
}

// configErr is the configuration error build returns for c, if any.
func configErr[C any](build func(C) (message.HandlerMiddleware, error), c C) error {
	_, err := build(c)
	return err
}

// tracedClaim is a claim for consumer, reporting to rec, on a store whose
// round trips rt counts.
func tracedClaim(t *testing.T, b bundle, consumer string) (c middleware.Claim, rt *roundTrips, rec *outcomes) {
	t.Helper()
	st, rt := traced(t, b)
	rec = &outcomes{}
	return middleware.Claim{Store: st, Consumer: consumer, Key: keyFunc(t), OnOutcome: rec.onOutcome}, rt, rec
}

// traced is a store on a pool whose round trips are counted.
func traced(t *testing.T, b bundle) (*store.Store, *roundTrips) {
	t.Helper()
	rt := &roundTrips{}
	st := b.storeWith(t, func(cfg *pgxpool.Config) { cfg.ConnConfig.Tracer = rt })
	require.NoError(t, st.Pool().Ping(context.Background()))
	return st, rt
}

// roundTrips counts what a pool sends to the server: each query outside a
// batch and each batch is one round trip.
type roundTrips struct{ n atomic.Int64 }

func (r *roundTrips) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	r.n.Add(1)
	return ctx
}
func (r *roundTrips) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (r *roundTrips) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	r.n.Add(1)
	return ctx
}
func (r *roundTrips) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (r *roundTrips) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}
