// Command receipts is the seed's step 6: an effect that leaves the
// database (sending a receipt e-mail through an external provider) made
// exactly-once with a transactional outbox and the provider's idempotency
// key; README.md beside this file draws the flow and walks through it.
// Each role is a subcommand, so each can be killed and restarted alone:
//
//	receipts provider   the e-mail provider (a stand-in honouring Idempotency-Key)
//	receipts orders     consumes OrderCompleted, enqueues send_receipt
//	receipts relay      publishes the outbox
//	receipts sender     consumes send_receipt, calls the provider
//	receipts all        orders, relay and sender in one process
//	receipts publish    publishes OrderCompleted events (-n, -from, -times)
//	receipts report     prints what every table holds
package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/claimtx/claimtx/brokers"
	// BROKER=amqp|kafka|nats: each adapter registers its kind when linked.
	_ "github.com/claimtx/claimtx/brokers/amqp"
	_ "github.com/claimtx/claimtx/brokers/kafka"
	_ "github.com/claimtx/claimtx/brokers/nats"
	"github.com/claimtx/claimtx/examples/loyalty/feed"
	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/store"
)

// Defaults of the environment variables in README.md.
const (
	defaultDatabaseURL   = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"
	defaultOrdersTopic   = "receipts.order-completed"
	defaultReceiptsTopic = "receipts.send-receipt"
	defaultProviderAddr  = "127.0.0.1:8089"
)

// Fault injection (RECEIPTS_CRASH) for the kill-and-replay walkthrough.
const (
	// crashAfterPublish: the relay SIGKILLs itself once the broker
	// confirmed its first Publish, before marking the rows sent.
	crashAfterPublish = "after-publish"
	// crashAfterCall: the sender SIGKILLs itself once the provider
	// accepted its first receipt, before its claim transaction commits.
	crashAfterCall = "after-call"
)

// settings is the environment, read once.
type settings struct {
	databaseURL   string
	schema        string
	ordersTopic   string
	receiptsTopic string
	providerAddr  string
	providerURL   string
	crash         string
	// broker may name NATS JetStream (BROKER=nats), a registered kind.
	broker brokers.Config
}

func loadSettings() (settings, error) {
	s := settings{
		databaseURL:   cmp.Or(os.Getenv("DATABASE_URL"), defaultDatabaseURL),
		schema:        os.Getenv("CLAIMTX_SCHEMA"),
		ordersTopic:   cmp.Or(os.Getenv("ORDERS_TOPIC"), defaultOrdersTopic),
		receiptsTopic: cmp.Or(os.Getenv("RECEIPTS_TOPIC"), defaultReceiptsTopic),
		providerAddr:  cmp.Or(os.Getenv("PROVIDER_ADDR"), defaultProviderAddr),
		crash:         os.Getenv("RECEIPTS_CRASH"),
	}
	s.providerURL = cmp.Or(os.Getenv("PROVIDER_URL"), "http://"+s.providerAddr)
	switch s.crash {
	case "", crashAfterPublish, crashAfterCall:
	default:
		return s, &framework.ConfigError{Field: "RECEIPTS_CRASH", Reason: fmt.Sprintf("%q is neither %q nor %q", s.crash, crashAfterPublish, crashAfterCall)}
	}
	var err error
	if s.broker, err = brokers.LoadConfig(os.Getenv("BROKER_CONFIG")); err != nil {
		return s, err
	}
	// A registered kind's settings are checked by Validate, not by the
	// loader: before anything connects.
	return s, s.broker.Validate()
}

// storeConfig names claimtx's schema; the example's own tables live in the
// connection's search_path.
func (s settings) storeConfig() store.Config { return store.Config{Schema: s.schema} }

// brokerFor returns one consumer's broker configuration: with Kafka its own
// group unless KAFKA_CONSUMER_GROUP is set; with NATS its own durable
// unless NATS_DURABLE (or the file's nats.durable) is.
func (s settings) brokerFor(consumer string) brokers.Config {
	b := s.broker
	if os.Getenv("KAFKA_CONSUMER_GROUP") == "" {
		b.Kafka.ConsumerGroup = consumer
	}
	if b.Kind == brokers.KindNATS && b.NATS.Durable == "" {
		b.NATS.Durable = consumer
	}
	return b
}

// connect opens the pool and creates the example's tables (several
// processes may start at once: feed.CreateTablesOnce).
func connect(ctx context.Context, s settings) (*pgxpool.Pool, error) {
	pool, err := pgxpool.New(ctx, s.databaseURL)
	if err != nil {
		return nil, &framework.ConfigError{Field: "DATABASE_URL", Reason: "cannot be used", Err: err}
	}
	err = feed.CreateTablesOnce(ctx, pool, "claimtx-example-receipts-tables",
		"SELECT to_regclass('receipt_requests') IS NOT NULL AND to_regclass('receipts_sent') IS NOT NULL AND to_regclass('provider_receipts') IS NOT NULL", `
-- The orders consumer's effect: one receipt request per order.
CREATE TABLE IF NOT EXISTS receipt_requests (
    order_id     bigint      PRIMARY KEY,
    email        text        NOT NULL,
    requested_at timestamptz NOT NULL DEFAULT now()
);
-- The sender consumer's effect: the provider's answer, per order.
CREATE TABLE IF NOT EXISTS receipts_sent (
    order_id            bigint      PRIMARY KEY,
    provider_receipt_id text        NOT NULL,
    idempotency_key     text        NOT NULL,
    sent_at             timestamptz NOT NULL DEFAULT now()
);
-- The provider's own database (a stand-in for the real provider's):
-- one row per Idempotency-Key, i.e. per e-mail actually sent, and how
-- many requests carried that key.
CREATE TABLE IF NOT EXISTS provider_receipts (
    idempotency_key text        PRIMARY KEY,
    receipt_id      text        NOT NULL,
    body_sha256     text        NOT NULL,
    order_id        bigint      NOT NULL,
    email           text        NOT NULL,
    requests        integer     NOT NULL DEFAULT 1,
    created_at      timestamptz NOT NULL DEFAULT now()
)`)
	if err != nil {
		pool.Close()
		return nil, fmt.Errorf("receipts: create tables: %w", err)
	}
	return pool, nil
}

// connectStore is connect with the store opened on the pool; migrate
// migrates it, for roles with no consumer.New (which migrates) before them.
func connectStore(ctx context.Context, s settings, migrate bool) (*pgxpool.Pool, *store.Store, error) {
	pool, err := connect(ctx, s)
	if err != nil {
		return nil, nil, err
	}
	st, err := store.New(pool, s.storeConfig())
	if err == nil && migrate {
		err = st.Migrate(ctx)
	}
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	return pool, st, nil
}

// crashNow is the fault injection: die like a power cut, with no deferred
// function, rollback or ack.
func crashNow(logger *slog.Logger, what string) {
	logger.Warn("receipts: fault injection: SIGKILL", "after", what)
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {}
}

const usage = `usage: receipts <provider|orders|relay|sender|all|publish|report> [flags]
see examples/receipts/README.md`

func run(ctx context.Context, logger *slog.Logger, args []string) error {
	if len(args) == 0 {
		return errors.New(usage)
	}
	s, err := loadSettings()
	if err != nil {
		return err
	}
	roles := map[string]func(context.Context, *slog.Logger, settings) error{
		"provider": runProvider, "orders": runOrders, "relay": runRelay, "sender": runSender, "all": runAll,
	}
	if role, ok := roles[args[0]]; ok {
		return role(ctx, logger, s)
	}
	switch args[0] {
	case "publish":
		return runPublish(ctx, logger, s, args[1:])
	case "report":
		return runReport(ctx, s, os.Stdout)
	}
	return fmt.Errorf("unknown command %q\n%s", args[0], usage)
}

func main() {
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, logger, os.Args[1:]); err != nil {
		logger.Error("receipts: stopped", "err", err)
		os.Exit(1)
	}
}

// runPublish plays the order service: each OrderCompleted -times times (a
// producer retrying), a fresh Watermill UUID per copy, the event_id header.
func runPublish(ctx context.Context, logger *slog.Logger, s settings, args []string) error {
	fs := flag.NewFlagSet("publish", flag.ContinueOnError)
	n := fs.Int("n", 10, "number of distinct orders")
	from := fs.Int64("from", 1, "first order id")
	times := fs.Int("times", 1, "copies of each event")
	if err := fs.Parse(args); err != nil {
		return err
	}
	pub, err := brokers.NewPublisher(s.broker, watermill.NewSlogLogger(logger))
	if err != nil {
		return err
	}
	defer func() { _ = pub.Close() }()
	for c := 0; c < *times; c++ {
		for id := *from; id < *from+int64(*n); id++ {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			body, err := json.Marshal(OrderCompleted{
				OrderID: id, CustomerID: id%7 + 1, Email: fmt.Sprintf("customer-%d@example.com", id%7+1), TotalCents: 1000 + id,
			})
			if err != nil {
				return err
			}
			msg := message.NewMessage(watermill.NewUUID(), body)
			msg.Metadata.Set("event_id", fmt.Sprintf("order-completed-%d", id))
			if err := pub.Publish(s.ordersTopic, msg); err != nil {
				return fmt.Errorf("publish order %d: %w", id, err)
			}
		}
	}
	logger.Info("receipts: published", "orders", *n, "copies_each", *times, "topic", s.ordersTopic)
	return nil
}

// runReport prints what every table holds.
func runReport(ctx context.Context, s settings, w io.Writer) error {
	pool, st, err := connectStore(ctx, s, true)
	if err != nil {
		return err
	}
	defer pool.Close()
	var requests, sent, providerReceipts, providerRequests int64
	err = pool.QueryRow(ctx, `SELECT
	(SELECT count(*) FROM receipt_requests),
	(SELECT count(*) FROM receipts_sent),
	(SELECT count(*) FROM provider_receipts),
	(SELECT coalesce(sum(requests), 0) FROM provider_receipts)`).Scan(&requests, &sent, &providerReceipts, &providerRequests)
	if err != nil {
		return fmt.Errorf("report: %w", err)
	}
	outbox, err := st.OutboxStats(ctx)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, `receipt requests (orders consumer):  %d
outbox rows pending / sent:          %d / %d
receipts recorded (sender consumer): %d
e-mails sent by the provider:        %d
requests the provider received:      %d
`, requests, outbox.Pending, outbox.Sent, sent, providerReceipts, providerRequests)
	return err
}
