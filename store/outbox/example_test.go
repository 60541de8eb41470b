package outbox_test

import (
	"context"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/jackc/pgx/v5"

	"github.com/claimtx/claimtx/internal/testenv"
	"github.com/claimtx/claimtx/store"
	"github.com/claimtx/claimtx/store/outbox"
)

// A message enqueued in the effect's transaction exists only if the
// effect committed; the Relay publishes it afterwards with an idempotency
// key that is the same on every resend.
func ExampleNew() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st := testenv.ExampleStore(ctx)
	defer testenv.DropExampleStore(st)
	pub := gochannel.NewGoChannel(gochannel.Config{Persistent: true}, nil) // brokers.NewPublisher(cfg, logger)
	defer func() { _ = pub.Close() }()

	err := pgx.BeginFunc(ctx, st.Pool(), func(tx pgx.Tx) error {
		// ... the effect, written through tx ...
		return st.Enqueue(ctx, tx, "receipts", message.NewMessage("r-9912", []byte(`{"order_id":9912}`)))
	})
	if err != nil {
		panic(err)
	}

	// Behind a transaction pooler (PgBouncer pool_mode=transaction) a
	// relay polls: LISTEN needs a session of its own.
	relay, err := outbox.New(st, pub, outbox.Config{DisableListen: testenv.BehindPooler()})
	if err != nil {
		panic(err)
	}
	done := make(chan error)
	go func() { done <- relay.Run(ctx) }()

	receipts, err := pub.Subscribe(ctx, "receipts")
	if err != nil {
		panic(err)
	}
	m := <-receipts
	m.Ack()
	fmt.Println(m.UUID, string(m.Payload), m.Metadata.Get(store.IdempotencyKeyMetadata) != "")

	cancel()
	fmt.Println("relay stopped:", <-done)

	// A relay needs somewhere to publish.
	_, err = outbox.New(st, nil, outbox.Config{})
	fmt.Println(err)
	// Output:
	// r-9912 {"order_id":9912} true
	// relay stopped: <nil>
	// claimtx: config field "Publisher": must not be nil
}
