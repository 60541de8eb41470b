package consumer_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/claimtx/claimtx/brokers"
	_ "github.com/claimtx/claimtx/brokers/amqp" // registers the kind
	"github.com/claimtx/claimtx/framework/consumer"
	"github.com/claimtx/claimtx/internal/testenv"
	"github.com/claimtx/claimtx/middleware"
	"github.com/claimtx/claimtx/store"
)

// A consumer of a RabbitMQ queue that credits each order once. The order
// is published twice (a producer's retry: new UUID, same order_id) beside
// a message without an order_id, which cannot be keyed and goes to the
// poison queue at once.
func ExampleNew() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ex := newExample(ctx) // a database schema with a ledger table, a unique queue
	defer ex.cleanup()

	outcomes := make(chan middleware.Result, 3)
	c, err := consumer.New(ctx, consumer.Config{
		Name:        "loyalty",
		Topic:       ex.topic,
		Key:         "template:order-completed:{payload.order_id}",
		DatabaseURL: ex.databaseURL,
		Store:       store.Config{Schema: ex.schema},
		Broker:      brokers.Config{Kind: brokers.KindAMQP, AMQP: brokers.AMQPConfig{URL: ex.amqpURL}},
		OnOutcome:   func(r middleware.Result) { outcomes <- r },
		Logger:      slog.New(slog.DiscardHandler),
	}, func(ctx context.Context, tx pgx.Tx, msg *message.Message) error {
		_, err := tx.Exec(ctx, "INSERT INTO ledger (order_id, points) VALUES ($1, 10)", orderID(msg))
		return err // commits with the claim, or rolls back with it
	})
	if err != nil {
		panic(err)
	}
	defer c.Close()
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	<-c.Running()

	// A producer elsewhere; here the consumer's own publisher.
	err = c.Publisher().Publish(ex.topic,
		message.NewMessage("delivery-1", []byte(`{"order_id":9912}`)),
		message.NewMessage("delivery-2", []byte(`{"order_id":9912}`)),
		message.NewMessage("delivery-3", []byte(`{"customer_id":7}`)),
	)
	if err != nil {
		panic(err)
	}
	fmt.Println(collect(ctx, outcomes, 3))
	fmt.Println("ledger rows:", ex.ledgerRows(ctx))

	cancel() // a SIGTERM: drain, then return
	fmt.Println("stopped:", <-done)
	// Output:
	// [applied duplicate poisoned]
	// ledger rows: 1
	// stopped: <nil>
}

// A batch consumer applies many messages in one claim transaction, with a
// handler that writes all of a batch's newly claimed messages in one
// statement. The window lets the subscriber hold a batch's worth of
// unacked messages.
func ExampleNewBatch() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ex := newExample(ctx)
	defer ex.cleanup()

	outcomes := make(chan middleware.Result, 4)
	c, err := consumer.NewBatch(ctx, consumer.Config{
		Name:        "loyalty",
		Topic:       ex.topic,
		Key:         "json:order_id",
		DatabaseURL: ex.databaseURL,
		Store:       store.Config{Schema: ex.schema},
		Broker:      brokers.Config{Kind: brokers.KindAMQP, AMQP: brokers.AMQPConfig{URL: ex.amqpURL, Window: 100}},
		OnOutcome:   func(r middleware.Result) { outcomes <- r },
		Logger:      slog.New(slog.DiscardHandler),
	}, func(ctx context.Context, tx pgx.Tx, msgs []*message.Message) error {
		ids := make([]int64, len(msgs))
		for i, m := range msgs {
			ids[i] = orderID(m)
		}
		_, err := tx.Exec(ctx, "INSERT INTO ledger (order_id, points) SELECT id, 10 FROM unnest($1::bigint[]) AS id", ids)
		return err
	}, consumer.BatchOptions{MaxSize: 100, MaxWait: 20 * time.Millisecond})
	if err != nil {
		panic(err)
	}
	defer c.Close()
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()

	var msgs []*message.Message
	for i, p := range []string{`{"order_id":1}`, `{"order_id":2}`, `{"order_id":3}`, `{"order_id":1}`} {
		msgs = append(msgs, message.NewMessage(fmt.Sprint("delivery-", i), []byte(p)))
	}
	if err := c.Publisher().Publish(ex.topic, msgs...); err != nil {
		panic(err)
	}
	fmt.Println(collect(ctx, outcomes, 4))
	fmt.Println("ledger rows:", ex.ledgerRows(ctx))

	cancel()
	fmt.Println("stopped:", <-done)
	// Output:
	// [applied applied applied duplicate]
	// ledger rows: 3
	// stopped: <nil>
}

// collect returns the outcomes of n messages, sorted: messages are
// settled concurrently, so their order varies.
func collect(ctx context.Context, outcomes <-chan middleware.Result, n int) []string {
	var got []string
	for len(got) < n {
		select {
		case r := <-outcomes:
			got = append(got, string(r.Outcome))
		case <-ctx.Done():
			panic(fmt.Sprint("outcomes so far: ", got))
		}
	}
	slices.Sort(got)
	return got
}

// example is one Example's world: a schema of its own on the test server
// (TEST_DATABASE_URL, as the tests use) holding claimtx's tables and a
// ledger, and a RabbitMQ queue name unique to the run.
type example struct {
	schema, databaseURL, amqpURL, topic string
}

func newExample(ctx context.Context) example {
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err)
	}
	ex := example{schema: "example_" + hex.EncodeToString(b[:]), amqpURL: os.Getenv("TEST_AMQP_URL")}
	if ex.amqpURL == "" {
		ex.amqpURL = "amqp://guest:guest@127.0.0.1:5672/"
	}
	ex.topic = "claimtx-example-" + ex.schema
	u, err := testenv.URLWithSearchPath(ex.schema)
	if err != nil {
		panic(err)
	}
	ex.databaseURL = u
	ex.exec(ctx, "CREATE SCHEMA "+ex.schema+"; CREATE TABLE "+ex.schema+".ledger (order_id bigint NOT NULL, points bigint NOT NULL)")
	return ex
}

func (ex example) exec(ctx context.Context, sql string) {
	conn, err := pgx.Connect(ctx, ex.databaseURL)
	if err != nil {
		panic(err)
	}
	defer func() { _ = conn.Close(ctx) }()
	if _, err := conn.Exec(ctx, sql); err != nil {
		panic(err)
	}
}

func (ex example) ledgerRows(ctx context.Context) int {
	conn, err := pgx.Connect(ctx, ex.databaseURL)
	if err != nil {
		panic(err)
	}
	defer func() { _ = conn.Close(ctx) }()
	var n int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM ledger").Scan(&n); err != nil {
		panic(err)
	}
	return n
}

// cleanup drops the schema and deletes the topic's and the poison topic's
// queues.
func (ex example) cleanup() {
	ex.exec(context.Background(), "DROP SCHEMA "+ex.schema+" CASCADE")
	testenv.DropSchemaRole(ex.schema)
	conn, err := amqp091.Dial(ex.amqpURL)
	if err != nil {
		return
	}
	defer conn.Close()
	for _, q := range []string{ex.topic, ex.topic + ".poison"} {
		if ch, err := conn.Channel(); err == nil {
			_, _ = ch.QueueDelete(q, false, false, false)
			_ = ch.Close()
		}
	}
}

func orderID(msg *message.Message) int64 {
	var o struct {
		OrderID int64 `json:"order_id"`
	}
	_ = json.Unmarshal(msg.Payload, &o)
	return o.OrderID
}
