// Command quickstart is the README's quick start, compiled so it cannot rot.
// It consumes order-completed from RabbitMQ and credits points exactly once.
package main

import (
	"context"
	"encoding/json"
	"log"
	"os"
	"os/signal"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/claimtx/claimtx/brokers"
	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/middleware"
	"github.com/claimtx/claimtx/store"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx); err != nil {
		log.Fatal(err)
	}
}

func run(ctx context.Context) error {
	// --- quick start (README.md) ---
	pool, err := pgxpool.New(ctx, "postgres://postgres@127.0.0.1:5432/postgres")
	if err != nil {
		return err
	}
	st, err := store.New(pool, store.Config{}) // schema "claimtx"
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
	sub, err := brokers.NewSubscriber(brokers.DefaultConfig(), watermill.NopLogger{}) // or any Watermill subscriber
	if err != nil {
		return err
	}
	pub, err := brokers.NewPublisher(brokers.DefaultConfig(), watermill.NopLogger{}) // or any Watermill publisher
	if err != nil {
		return err
	}
	poison, err := middleware.NewPoison(middleware.Poison{Publisher: pub, Topic: "order-completed.poison"})
	if err != nil {
		return err
	}
	router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	if err != nil {
		return err
	}
	h := router.AddConsumerHandler("loyalty", "order-completed", sub,
		middleware.TxHandler(func(ctx context.Context, tx pgx.Tx, msg *message.Message) error {
			var o struct {
				CustomerID int64 `json:"customer_id"`
				TotalCents int64 `json:"total_cents"`
			}
			if err := json.Unmarshal(msg.Payload, &o); err != nil {
				return framework.Permanent(err) // never retried: poisoned with the reason
			}
			_, err := tx.Exec(ctx, "UPDATE balances SET points = points + $1 WHERE customer_id = $2", o.TotalCents/100, o.CustomerID)
			return err // runs only for the first delivery of each order; commits with the claim
		}))
	h.AddMiddleware(poison, claim) // a message that cannot be applied goes to order-completed.poison
	return router.Run(ctx)
	// --- end of quick start ---
}
