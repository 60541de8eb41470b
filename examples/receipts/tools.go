package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/claimtx/claimtx/brokers"
	"github.com/claimtx/claimtx/store"
)

// runPublish plays the order service: it publishes OrderCompleted events,
// each -times times (a redelivering broker, a producer retrying), with a
// fresh Watermill UUID per copy and the producer's event_id header.
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

// Report is what runReport prints, one line per field.
type Report struct {
	ReceiptRequests  int64 // orders consumer effects
	OutboxPending    int64
	OutboxSent       int64
	ReceiptsSent     int64 // sender consumer effects
	ProviderReceipts int64 // e-mails the provider actually sent
	ProviderRequests int64 // calls it received, repeats included
}

func readReport(ctx context.Context, pool *pgxpool.Pool, st *store.Store) (Report, error) {
	var r Report
	err := pool.QueryRow(ctx, `SELECT
	(SELECT count(*) FROM receipt_requests),
	(SELECT count(*) FROM receipts_sent),
	(SELECT count(*) FROM provider_receipts),
	(SELECT coalesce(sum(requests), 0) FROM provider_receipts)`).Scan(&r.ReceiptRequests, &r.ReceiptsSent, &r.ProviderReceipts, &r.ProviderRequests)
	if err != nil {
		return r, fmt.Errorf("report: %w", err)
	}
	stats, err := st.OutboxStats(ctx)
	if err != nil {
		return r, err
	}
	r.OutboxPending, r.OutboxSent = stats.Pending, stats.Sent
	return r, nil
}

func runReport(ctx context.Context, s settings, w io.Writer) error {
	pool, st, err := connectStore(ctx, s, true)
	if err != nil {
		return err
	}
	defer pool.Close()
	r, err := readReport(ctx, pool, st)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, `receipt requests (orders consumer):  %d
outbox rows pending / sent:          %d / %d
receipts recorded (sender consumer): %d
e-mails sent by the provider:        %d
requests the provider received:      %d
`, r.ReceiptRequests, r.OutboxPending, r.OutboxSent, r.ReceiptsSent, r.ProviderReceipts, r.ProviderRequests)
	return err
}
