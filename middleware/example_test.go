package middleware_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/jackc/pgx/v5"

	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/internal/testenv"
	"github.com/claimtx/claimtx/middleware"
	"github.com/claimtx/claimtx/store"
)

// The claim wraps a handler that writes its effect through the claim
// transaction. The same order delivered twice (a redelivery has a new
// Watermill UUID, but the same order_id) is credited once.
func ExampleNewClaim() {
	ctx := context.Background()
	st := exampleStore(ctx)
	defer testenv.DropExampleStore(st)

	key, err := framework.ParseKeySpec("template:order-completed:{payload.order_id}")
	if err != nil {
		panic(err)
	}
	claim, err := middleware.NewClaim(middleware.Claim{
		Store: st, Consumer: "loyalty", Key: key,
		OnOutcome: func(r middleware.Result) { fmt.Println(r.Key, r.Outcome) },
	})
	if err != nil {
		panic(err)
	}
	credit := middleware.TxHandler(func(ctx context.Context, tx pgx.Tx, msg *message.Message) error {
		_, err := tx.Exec(ctx, "INSERT INTO ledger (order_id, points) VALUES ($1, 10)", orderID(msg))
		return err
	})
	h := claim(func(msg *message.Message) ([]*message.Message, error) { return nil, credit(msg) })

	for _, uuid := range []string{"delivery-1", "delivery-2"} {
		if _, err := h(message.NewMessage(uuid, []byte(`{"order_id":9912}`))); err != nil {
			panic(err)
		}
	}
	fmt.Println("ledger rows:", ledgerRows(ctx, st))
	// Output:
	// order-completed:9912 applied
	// order-completed:9912 duplicate
	// ledger rows: 1
}

// Poison sends what can never be applied to a poison topic with the
// reason, so the router acks the original instead of redelivering it
// forever. Here the handler finds the order unusable: a permanent error.
func ExampleNewPoison() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	bus := gochannel.NewGoChannel(gochannel.Config{Persistent: true}, nil) // your broker's publisher
	defer func() { _ = bus.Close() }()

	poison, err := middleware.NewPoison(middleware.Poison{Publisher: bus, Topic: "orders.poison", Consumer: "loyalty"})
	if err != nil {
		panic(err)
	}
	h := poison(func(msg *message.Message) ([]*message.Message, error) {
		return nil, framework.Permanent(fmt.Errorf("order %d: unknown currency", orderID(msg)))
	})

	_, err = h(message.NewMessage("m1", []byte(`{"order_id":9912,"currency":"XXX"}`)))
	fmt.Println("returned to the router:", err)

	copies, err := bus.Subscribe(ctx, "orders.poison")
	if err != nil {
		panic(err)
	}
	c := <-copies
	c.Ack()
	fmt.Println(c.UUID, string(c.Payload))
	fmt.Println(c.Metadata.Get(middleware.PoisonReasonKey))
	fmt.Println(c.Metadata.Get("claimtx_poison_consumer"), c.Metadata.Get("claimtx_poison_permanent"))

	// Without a publisher there is nowhere to send it: refused up front.
	_, err = middleware.NewPoison(middleware.Poison{Topic: "orders.poison"})
	fmt.Println(err)
	// Output:
	// returned to the router: <nil>
	// m1 {"order_id":9912,"currency":"XXX"}
	// order 9912: unknown currency
	// loyalty true
	// claimtx: config field "Publisher": must not be nil
}

// A Batch claims many messages in one transaction and applies the newly
// claimed ones with one set-wise statement. The batch holds a duplicate of
// order 1 and a message that cannot be keyed; each gets its own result.
func ExampleNewBatch() {
	ctx := context.Background()
	st := exampleStore(ctx)
	defer testenv.DropExampleStore(st)

	key, _ := framework.ParseKeySpec("json:order_id")
	batch, err := middleware.NewBatch(middleware.Claim{Store: st, Consumer: "loyalty", Key: key})
	if err != nil {
		panic(err)
	}
	credit := func(ctx context.Context, tx pgx.Tx, msgs []*message.Message) error {
		ids := make([]int64, len(msgs))
		for i, m := range msgs {
			ids[i] = orderID(m)
		}
		_, err := tx.Exec(ctx, "INSERT INTO ledger (order_id, points) SELECT id, 10 FROM unnest($1::bigint[]) AS id", ids)
		return err
	}

	var msgs []*message.Message
	for i, p := range []string{`{"order_id":1}`, `{"order_id":2}`, `{"order_id":1}`, `{}`} {
		msgs = append(msgs, message.NewMessage(fmt.Sprint("m", i), []byte(p)))
	}
	for i, err := range batch.Process(ctx, msgs, credit) {
		fmt.Println(msgs[i].UUID, err == nil, framework.IsPermanent(err))
	}
	fmt.Println("ledger rows:", ledgerRows(ctx, st))

	// A batch claims in the claim table only.
	_, err = middleware.NewBatch(middleware.Claim{Store: st, Consumer: "loyalty", Key: key, OutboxTopic: "receipts"})
	var ce *framework.ConfigError
	fmt.Println(errors.As(err, &ce), ce.Field)
	// Output:
	// m0 true false
	// m1 true false
	// m2 true false
	// m3 false true
	// ledger rows: 2
	// true OutboxTopic
}

// exampleStore returns a migrated store in a schema of its own on the test
// server (TEST_DATABASE_URL, as the tests use), with a ledger table; its
// pool's search_path is that schema.
func exampleStore(ctx context.Context) *store.Store {
	st := testenv.ExampleStore(ctx)
	if _, err := st.Pool().Exec(ctx, "CREATE TABLE ledger (order_id bigint NOT NULL, points bigint NOT NULL)"); err != nil {
		panic(err)
	}
	return st
}

func ledgerRows(ctx context.Context, st *store.Store) int {
	var n int
	if err := st.Pool().QueryRow(ctx, "SELECT count(*) FROM ledger").Scan(&n); err != nil {
		panic(err)
	}
	return n
}

func orderID(msg *message.Message) int64 {
	var o struct {
		OrderID int64 `json:"order_id"`
	}
	_ = json.Unmarshal(msg.Payload, &o)
	return o.OrderID
}
