// Command quickstart is the README's quick start, compiled and run by
// quickstart_test.go so it cannot rot: the region between the two marker
// comments in run is the README's Go block, byte for byte (less one tab).
// It consumes order-completed from RabbitMQ and credits points exactly once.
//
// The environment overrides the defaults written in the snippet: TOPIC,
// DATABASE_URL, CLAIMTX_SCHEMA, and the broker variables of
// brokers.LoadConfig (AMQP_URL, …). Only brokers/amqp is linked, so
// BROKER=kafka fails with an error that says which package to import.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"log"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/claimtx/claimtx/brokers"
	_ "github.com/claimtx/claimtx/brokers/amqp" // links the "amqp" kind, and only RabbitMQ's client
	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/middleware"
	"github.com/claimtx/claimtx/store"
)

func main() {
	// SIGTERM is what an orchestrator sends; Ctrl-C is SIGINT.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx); err != nil {
		log.Fatal(err)
	}
}

// getenv returns the environment variable name, or def when it is unset.
func getenv(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func run(ctx context.Context) error {
	// --- quick start (README.md) ---
	topic := getenv("TOPIC", "order-completed") // getenv: os.Getenv with a default
	pool, err := pgxpool.New(ctx, getenv("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres"))
	if err != nil {
		return err
	}
	defer pool.Close()
	// The effect's table; a real service creates it in its own migrations.
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS balances (
		customer_id bigint PRIMARY KEY, points bigint NOT NULL)`); err != nil {
		return err
	}
	st, err := store.New(pool, store.Config{Schema: getenv("CLAIMTX_SCHEMA", "claimtx")})
	if err != nil {
		return err
	}
	if err := st.Migrate(ctx); err != nil { // idempotent, safe from many instances
		return err
	}
	key, err := framework.ParseKeySpec("template:order-completed:{payload.order_id}")
	if err != nil {
		return err
	}
	claim, err := middleware.NewClaim(middleware.Claim{Store: st, Consumer: "loyalty", Key: key})
	if err != nil { // a bad configuration stops here, never in a redelivery loop
		return err
	}

	logger := watermill.NewSlogLogger(slog.Default())
	brokerCfg, err := brokers.LoadConfig("") // RabbitMQ on 127.0.0.1 unless AMQP_URL or BROKER say otherwise
	if err != nil {
		return err
	}
	sub, err := brokers.NewSubscriber(brokerCfg, logger) // or any Watermill subscriber
	if err != nil {
		return err
	}
	pub, err := brokers.NewPublisher(brokerCfg, logger) // or any Watermill publisher
	if err != nil {
		return err
	}
	poison, err := middleware.NewPoison(middleware.Poison{Publisher: pub, Topic: topic + ".poison"})
	if err != nil {
		return err
	}

	router, err := message.NewRouter(message.RouterConfig{}, logger)
	if err != nil {
		return err
	}
	h := router.AddConsumerHandler("loyalty", topic, sub,
		middleware.TxHandler(func(ctx context.Context, tx pgx.Tx, msg *message.Message) error {
			var o struct {
				CustomerID int64 `json:"customer_id"`
				TotalCents int64 `json:"total_cents"`
			}
			if err := json.Unmarshal(msg.Payload, &o); err != nil {
				return framework.Permanent(err) // never retried: poisoned with the reason
			}
			_, err := tx.Exec(ctx, `INSERT INTO balances (customer_id, points) VALUES ($1, $2)
				ON CONFLICT (customer_id) DO UPDATE SET points = balances.points + EXCLUDED.points`,
				o.CustomerID, o.TotalCents/100)
			return err // runs once per order; commits with the claim
		}))
	h.AddMiddleware(poison, claim) // what cannot be applied goes to <topic>.poison, with the reason
	err = router.Run(ctx)          // until SIGINT or SIGTERM, then drains and returns nil
	return errors.Join(err, pub.Close())
	// --- end of quick start ---
}
