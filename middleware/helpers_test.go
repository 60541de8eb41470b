package middleware_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/middleware"
	"github.com/claimtx/claimtx/store"
	"github.com/claimtx/claimtx/store/pgtest"
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
	pool, schema := pgtest.Setup(t, maxConns)
	st, err := store.New(pool, store.Config{Schema: schema})
	require.NoError(t, err)
	ctx := context.Background()
	require.NoError(t, st.Migrate(ctx))
	_, err = pool.Exec(ctx, `
CREATE TABLE balances (customer_id bigint PRIMARY KEY, points bigint NOT NULL);
CREATE TABLE point_ledger (customer_id bigint NOT NULL, order_id bigint NOT NULL, points bigint NOT NULL)`)
	require.NoError(t, err)
	return bundle{pool: pool, store: st, schema: schema}
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
	msg := message.NewMessage(watermill.NewUUID(), payload)
	msg.Metadata.Set("event_id", fmt.Sprintf("evt-%d", o.OrderID))
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
	kf, err := framework.ParseKeySpec("template:order-completed:{payload.order_id}")
	require.NoError(t, err)
	return kf
}

// outcomes records every Result the middleware reports.
type outcomes struct {
	mu      sync.Mutex
	results []middleware.Result
	retries []middleware.Retry
}

func (o *outcomes) onOutcome(r middleware.Result) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.results = append(o.results, r)
}

func (o *outcomes) onRetry(r middleware.Retry) {
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
	c := middleware.Claim{Store: b.store, Consumer: consumer, Key: keyFunc(t)}
	if rec != nil {
		c.OnOutcome = rec.onOutcome
		c.OnRetry = rec.onRetry
	}
	require.NoError(t, c.Validate())
	return c
}

func (b bundle) scalar(t testing.TB, sql string, args ...any) int64 {
	t.Helper()
	var n int64
	require.NoError(t, b.pool.QueryRow(context.Background(), sql, args...).Scan(&n))
	return n
}

func (b bundle) balance(t testing.TB, customer int64) int64 {
	return b.scalar(t, "SELECT coalesce(sum(points), 0) FROM balances WHERE customer_id = $1", customer)
}

func (b bundle) ledgerRows(t testing.TB, orderID int64) int64 {
	return b.scalar(t, "SELECT count(*) FROM point_ledger WHERE order_id = $1", orderID)
}

func (b bundle) claims(t testing.TB, consumer string) int64 {
	return b.scalar(t, fmt.Sprintf("SELECT count(*) FROM %s WHERE consumer = $1", pgx.Identifier{b.schema, "processed_messages"}.Sanitize()), consumer)
}

// consume turns a typed handler into a HandlerFunc that tests can wrap with
// Claim.Middleware and call directly, one delivery per call.
func consume(fn middleware.TxHandlerFunc) message.HandlerFunc {
	h := middleware.TxHandler(fn)
	return func(msg *message.Message) ([]*message.Message, error) { return nil, h(msg) }
}

// deliverTwins delivers n copies of one order to h at once, each on its own
// open connection, and checks that exactly one applied and no error
// reached the router.
func deliverTwins(t *testing.T, b bundle, h message.HandlerFunc, rec *outcomes, n int) {
	t.Helper()
	o := order{OrderID: 9913, CustomerID: 8, TotalCents: 1000}
	warm(t, b.pool, n)
	start := make(chan struct{})
	errs := make(chan error, n)
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			_, err := h(newDelivery(t, o))
			errs <- err
		}()
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err, "no error may surface to the router")
	}
	require.Equal(t, 1, rec.count(framework.Applied))
	require.Equal(t, n-1, rec.count(framework.Duplicate))
	require.Equal(t, int64(10), b.balance(t, 8))
	require.Equal(t, int64(1), b.ledgerRows(t, 9913))
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
