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

	"github.com/claimtx/claimtx/brokers"
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
