//go:build bench

package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/url"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/store"
)

// env is one measurement's world: its own schema (effect tables and claim
// table), a pool sized for the concurrency, a fresh topic name.
type env struct {
	schema string
	topic  string
	pool   *pgxpool.Pool
	store  *store.Store
}

func randID() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func newEnv(ctx context.Context, databaseURL string, concurrency int) (*env, error) {
	id := randID()
	e := &env{schema: "bench_" + id, topic: "bench-" + id}
	u, err := url.Parse(databaseURL)
	if err != nil {
		return nil, err
	}
	q := u.Query()
	q.Set("search_path", e.schema)
	u.RawQuery = q.Encode()
	cfg, err := pgxpool.ParseConfig(u.String())
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = int32(concurrency) + 2
	cfg.MinConns = int32(concurrency)
	if e.pool, err = pgxpool.NewWithConfig(ctx, cfg); err != nil {
		return nil, err
	}
	if _, err := e.pool.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{e.schema}.Sanitize()+`;
CREATE TABLE balances (customer_id bigint PRIMARY KEY, points bigint NOT NULL);
CREATE TABLE point_ledger (customer_id bigint NOT NULL, order_id bigint NOT NULL, points bigint NOT NULL, created_at timestamptz DEFAULT now())`); err != nil {
		return nil, err
	}
	if e.store, err = store.New(e.pool, store.Config{Schema: e.schema}); err != nil {
		return nil, err
	}
	if err := e.store.Migrate(ctx); err != nil {
		return nil, err
	}
	return e, nil
}

func (e *env) close(ctx context.Context, admin *pgxpool.Pool) {
	e.pool.Close()
	_, _ = admin.Exec(ctx, "DROP SCHEMA "+pgx.Identifier{e.schema}.Sanitize()+" CASCADE")
}

type order struct {
	OrderID    int64 `json:"order_id"`
	CustomerID int64 `json:"customer_id"`
	TotalCents int64 `json:"total_cents"`
}

// customers bounds the hot rows: enough that concurrent transactions
// rarely queue on one balance row, as in a real loyalty workload.
const customers = 1000

func orderN(i int) order { return orderOf(i, customers) }

// hotCustomers is the hot-key scenario's: every group of concurrent
// transactions shares balance rows, in no order.
const hotCustomers = 10

func orderOf(i, customers int) order {
	return order{OrderID: int64(i), CustomerID: int64(i%customers + 1), TotalCents: int64(100 + i%10_000)}
}

func payload(o order) []byte {
	b, _ := json.Marshal(o)
	return b
}

// effect is the seed's loyalty effect, the same in every mode.
func effect(ctx context.Context, tx pgx.Tx, o order) error {
	points := o.TotalCents / 100
	if _, err := tx.Exec(ctx, `INSERT INTO balances (customer_id, points) VALUES ($1, $2)
		ON CONFLICT (customer_id) DO UPDATE SET points = balances.points + EXCLUDED.points`, o.CustomerID, points); err != nil {
		return err
	}
	_, err := tx.Exec(ctx, `INSERT INTO point_ledger (customer_id, order_id, points) VALUES ($1, $2, $3)`, o.CustomerID, o.OrderID, points)
	return err
}

// effectGuarded is effect written for ModeNaturalKey: the ledger row,
// unique by order_id, is the claim; finding it present means the order
// was applied before.
func effectGuarded(ctx context.Context, tx pgx.Tx, o order) error {
	points := o.TotalCents / 100
	tag, err := tx.Exec(ctx, `INSERT INTO point_ledger (customer_id, order_id, points) VALUES ($1, $2, $3)
		ON CONFLICT (order_id) DO NOTHING`, o.CustomerID, o.OrderID, points)
	if err != nil {
		return err
	}
	if tag.RowsAffected() == 0 {
		return framework.ErrAlreadyApplied
	}
	_, err = tx.Exec(ctx, `INSERT INTO balances (customer_id, points) VALUES ($1, $2)
		ON CONFLICT (customer_id) DO UPDATE SET points = balances.points + EXCLUDED.points`, o.CustomerID, points)
	return err
}

// effectSet is effect for many orders in one statement, the form a batch
// handler takes: ledger rows and balance increments set-wise, balances
// inserted or locked in customer order so concurrent batches queue on a
// shared customer instead of deadlocking.
func effectSet(ctx context.Context, tx pgx.Tx, msgs []*message.Message) error {
	customers := make([]int64, len(msgs))
	orders := make([]int64, len(msgs))
	points := make([]int64, len(msgs))
	for i, msg := range msgs {
		o, err := decode(msg)
		if err != nil {
			return framework.Permanent(err)
		}
		customers[i], orders[i], points[i] = o.CustomerID, o.OrderID, o.TotalCents/100
	}
	_, err := tx.Exec(ctx, `WITH o AS (
	SELECT * FROM unnest($1::bigint[], $2::bigint[], $3::bigint[]) AS o(customer_id, order_id, points)
), ledger AS (
	INSERT INTO point_ledger (customer_id, order_id, points) SELECT customer_id, order_id, points FROM o
)
INSERT INTO balances (customer_id, points)
SELECT customer_id, sum(points) FROM o GROUP BY customer_id ORDER BY customer_id
ON CONFLICT (customer_id) DO UPDATE SET points = balances.points + EXCLUDED.points`, customers, orders, points)
	return err
}

func decode(msg *message.Message) (order, error) {
	var o order
	if err := json.Unmarshal(msg.Payload, &o); err != nil {
		return o, fmt.Errorf("decode: %w", err)
	}
	return o, nil
}
