package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/claimtx/claimtx/brokers"
	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/framework/consumer"
	"github.com/claimtx/claimtx/middleware"
	"github.com/claimtx/claimtx/store"
	"github.com/claimtx/claimtx/store/outbox"
)

// Consumer names, stored with their claims.
const (
	ordersConsumer = "receipts-orders"
	senderConsumer = "receipts-sender"
)

// OrderCompleted is the event the orders consumer reads.
type OrderCompleted struct {
	OrderID    int64  `json:"order_id"`
	CustomerID int64  `json:"customer_id"`
	Email      string `json:"email"`
	TotalCents int64  `json:"total_cents"`
}

// logOutcome logs every message's outcome: what the walkthrough in
// README.md (and the test) reads to see duplicates being dropped.
func logOutcome(logger *slog.Logger) func(middleware.Result) {
	return func(r middleware.Result) {
		logger.Info("receipts: message", "consumer", r.Consumer, "outcome", string(r.Outcome), "attempts", r.Attempts)
	}
}

// requestReceipt is the orders consumer's effect, in its claim
// transaction: a receipt_requests row and a send_receipt message in the
// outbox, one per order however often OrderCompleted is delivered. No
// e-mail is sent here: a rolled-back transaction cannot un-send one.
func requestReceipt(st *store.Store, receiptsTopic string) middleware.TxHandlerFunc {
	return func(ctx context.Context, tx pgx.Tx, msg *message.Message) error {
		var o OrderCompleted
		if err := json.Unmarshal(msg.Payload, &o); err != nil {
			return framework.Permanent(fmt.Errorf("receipts: undecodable OrderCompleted: %w", err))
		}
		if o.OrderID == 0 || o.Email == "" {
			return framework.Permanent(errors.New("receipts: OrderCompleted needs order_id and email"))
		}
		if _, err := tx.Exec(ctx, "INSERT INTO receipt_requests (order_id, email) VALUES ($1, $2)", o.OrderID, o.Email); err != nil {
			return fmt.Errorf("receipts: record request: %w", err)
		}
		body, err := json.Marshal(Receipt{OrderID: o.OrderID, Email: o.Email, TotalCents: o.TotalCents})
		if err != nil {
			return framework.Permanent(err)
		}
		out := message.NewMessage(watermill.NewUUID(), body)
		out.Metadata.Set("kind", "send_receipt")
		return st.Enqueue(ctx, tx, receiptsTopic, out)
	}
}

// sendReceipt is the sender consumer's effect, keyed by the relay's
// claimtx_idempotency_key: the relay's resends never reach the provider, and
// a redelivery after a crash between the call and the commit calls again
// with the same Idempotency-Key, answered with the stored receipt (README.md).
func sendReceipt(client *http.Client, providerURL string, crash bool, logger *slog.Logger) middleware.TxHandlerFunc {
	var crashed atomic.Bool
	return func(ctx context.Context, tx pgx.Tx, msg *message.Message) error {
		var rc Receipt
		if err := json.Unmarshal(msg.Payload, &rc); err != nil {
			return framework.Permanent(fmt.Errorf("receipts: undecodable send_receipt: %w", err))
		}
		key := msg.Metadata.Get(store.IdempotencyKeyMetadata)
		receiptID, err := callProvider(ctx, client, providerURL, key, msg.Payload)
		if err != nil {
			return err
		}
		if crash && crashed.CompareAndSwap(false, true) {
			crashNow(logger, "the provider accepted the receipt, before the sender's commit")
		}
		_, err = tx.Exec(ctx, "INSERT INTO receipts_sent (order_id, provider_receipt_id, idempotency_key) VALUES ($1, $2, $3)",
			rc.OrderID, receiptID, key)
		if err != nil {
			return fmt.Errorf("receipts: record sent receipt: %w", err)
		}
		return nil
	}
}

// callProvider POSTs the receipt with the idempotency key and returns the
// provider's receipt id. Client errors other than 408/429 are permanent:
// resending the same request cannot fix them.
func callProvider(ctx context.Context, client *http.Client, providerURL, key string, body []byte) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, providerURL+receiptsPath, bytes.NewReader(body))
	if err != nil {
		return "", framework.Permanent(fmt.Errorf("receipts: provider request: %w", err))
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(idempotencyKeyHeader, key)
	resp, err := client.Do(req)
	if err != nil {
		return "", fmt.Errorf("receipts: provider: %w", err)
	}
	defer func() { _ = resp.Body.Close() }() // fully read below; nothing to report
	data, err := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	if err != nil {
		return "", fmt.Errorf("receipts: provider response: %w", err)
	}
	switch {
	case resp.StatusCode == http.StatusOK || resp.StatusCode == http.StatusCreated:
	case resp.StatusCode >= 400 && resp.StatusCode < 500 && resp.StatusCode != http.StatusRequestTimeout && resp.StatusCode != http.StatusTooManyRequests:
		return "", framework.Permanent(fmt.Errorf("receipts: provider refused the receipt: %s: %s", resp.Status, bytes.TrimSpace(data)))
	default:
		return "", fmt.Errorf("receipts: provider: %s", resp.Status)
	}
	var out receiptResponse
	if err := json.Unmarshal(data, &out); err != nil || out.ReceiptID == "" {
		return "", fmt.Errorf("receipts: provider answered %s without a receipt id", resp.Status)
	}
	return out.ReceiptID, nil
}

func runOrders(ctx context.Context, logger *slog.Logger, s settings) error {
	return consume(ctx, logger, s, ordersConsumer, s.ordersTopic, "template:order-completed:{payload.order_id}",
		func(st *store.Store) middleware.TxHandlerFunc { return requestReceipt(st, s.receiptsTopic) },
		"receipts: orders consumer running", "topic", s.ordersTopic, "enqueues_to", s.receiptsTopic)
}

func runSender(ctx context.Context, logger *slog.Logger, s settings) error {
	client := &http.Client{Timeout: 10 * time.Second}
	return consume(ctx, logger, s, senderConsumer, s.receiptsTopic, "metadata:"+store.IdempotencyKeyMetadata,
		func(*store.Store) middleware.TxHandlerFunc {
			return sendReceipt(client, s.providerURL, s.crash == crashAfterCall, logger)
		},
		"receipts: sender consumer running", "topic", s.receiptsTopic, "provider", s.providerURL)
}

// consume runs the consumer name on topic, keyed by key, with the handler
// handler builds on the role's store, and logs msg with attrs before it runs.
func consume(ctx context.Context, logger *slog.Logger, s settings, name, topic, key string,
	handler func(*store.Store) middleware.TxHandlerFunc, msg string, attrs ...any) error {
	pool, st, err := connectStore(ctx, s, false)
	if err != nil {
		return err
	}
	defer pool.Close()
	c, err := consumer.New(ctx, consumer.Config{
		Name:      name,
		Topic:     topic,
		Key:       key,
		Pool:      pool,
		Store:     s.storeConfig(),
		Broker:    s.brokerFor(name),
		OnOutcome: logOutcome(logger),
		Logger:    logger,
	}, handler(st))
	if err != nil {
		return err
	}
	defer func() { _ = c.Close() }()
	logger.Info(msg, attrs...)
	return c.Run(ctx)
}

// crashingPublisher SIGKILLs the process once the broker confirmed a
// Publish: the relay has published but not yet marked the rows.
type crashingPublisher struct {
	message.Publisher
	logger *slog.Logger
}

func (p crashingPublisher) Publish(topic string, msgs ...*message.Message) error {
	if err := p.Publisher.Publish(topic, msgs...); err != nil {
		return err
	}
	crashNow(p.logger, fmt.Sprintf("publishing %d message(s), before marking them sent", len(msgs)))
	return nil
}

func runRelay(ctx context.Context, logger *slog.Logger, s settings) error {
	pool, st, err := connectStore(ctx, s, true)
	if err != nil {
		return err
	}
	defer pool.Close()
	wlog := watermill.NewSlogLogger(logger)
	pub, err := brokers.NewPublisher(s.broker, wlog)
	if err != nil {
		return err
	}
	defer func() { _ = pub.Close() }()
	if s.crash == crashAfterPublish {
		pub = crashingPublisher{Publisher: pub, logger: logger}
	}
	// LISTEN needs a session of its own, which a transaction pooler does not
	// keep: there the relay polls (Run would refuse to LISTEN).
	pooled, err := st.BehindTransactionPooler(ctx)
	if err != nil {
		return err
	}
	if pooled {
		logger.Info("receipts: behind a transaction pooler, the relay polls")
	}
	relay, err := outbox.New(st, pub, outbox.Config{
		DisableListen: pooled,
		Logger:        wlog,
		OnBatch: func(b outbox.Batch) {
			if b.Published > 0 {
				logger.Info("receipts: relayed", "published", b.Published)
			}
		},
	})
	if err != nil {
		return err
	}
	logger.Info("receipts: relay running", "broker", s.broker.Kind)
	return relay.Run(ctx)
}

// runAll runs the orders consumer, the relay and the sender in one process;
// the first to fail stops the others.
func runAll(ctx context.Context, logger *slog.Logger, s settings) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	roles := []func(context.Context, *slog.Logger, settings) error{runOrders, runRelay, runSender}
	errs := make([]error, len(roles))
	var wg sync.WaitGroup
	for i, role := range roles {
		wg.Go(func() {
			if errs[i] = role(ctx, logger, s); errs[i] != nil {
				cancel()
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// Receipt is the provider API's request body.
type Receipt struct {
	OrderID    int64  `json:"order_id"`
	Email      string `json:"email"`
	TotalCents int64  `json:"total_cents"`
}

// receiptResponse is the provider's answer.
type receiptResponse struct {
	ReceiptID string `json:"receipt_id"`
}

// Provider API details, as the sender uses them.
const (
	receiptsPath         = "/v1/receipts"
	idempotencyKeyHeader = "Idempotency-Key"
)

// provider stands in for an e-mail provider with Stripe-style idempotency
// (README.md): a key's first request sends, a repeat gets the stored answer,
// another body is refused (422). Its state in Postgres survives restarts.
type provider struct {
	pool   *pgxpool.Pool
	logger *slog.Logger
}

func (p *provider) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) })
	mux.HandleFunc("POST "+receiptsPath, p.send)
	return mux
}

func (p *provider) send(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get(idempotencyKeyHeader)
	if key == "" || len(key) > 255 {
		http.Error(w, "an Idempotency-Key header of at most 255 bytes is required", http.StatusBadRequest)
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<16))
	if err != nil {
		http.Error(w, "cannot read body", http.StatusBadRequest)
		return
	}
	var rc Receipt
	if err := json.Unmarshal(body, &rc); err != nil || rc.OrderID == 0 || rc.Email == "" {
		http.Error(w, "body must be {order_id, email, total_cents}", http.StatusBadRequest)
		return
	}
	sum := sha256.Sum256(body)
	hash := hex.EncodeToString(sum[:])
	// One statement: a concurrent request with the same key waits for this
	// one's row, then counts as a repeat.
	var receiptID, storedHash string
	var requests int
	err = p.pool.QueryRow(r.Context(), `
INSERT INTO provider_receipts (idempotency_key, receipt_id, body_sha256, order_id, email)
VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (idempotency_key) DO UPDATE SET requests = provider_receipts.requests + 1
RETURNING receipt_id, body_sha256, requests`,
		key, "rcpt_"+watermill.NewShortUUID(), hash, rc.OrderID, rc.Email).Scan(&receiptID, &storedHash, &requests)
	if err != nil {
		p.logger.Error("provider: store", "err", err)
		http.Error(w, "temporarily unavailable", http.StatusServiceUnavailable)
		return
	}
	switch {
	case storedHash != hash:
		http.Error(w, "Idempotency-Key reused with a different body", http.StatusUnprocessableEntity)
		return
	case requests == 1:
		p.logger.Info("provider: receipt e-mail sent", "order_id", rc.OrderID, "email", rc.Email, "receipt_id", receiptID)
		writeJSON(w, http.StatusCreated, receiptResponse{ReceiptID: receiptID})
	default:
		p.logger.Info("provider: repeated request, e-mail not sent again", "order_id", rc.OrderID, "receipt_id", receiptID, "requests", requests)
		w.Header().Set("Idempotent-Replayed", "true")
		writeJSON(w, http.StatusOK, receiptResponse{ReceiptID: receiptID})
	}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v) // the client went away: nothing to do
}

func runProvider(ctx context.Context, logger *slog.Logger, s settings) error {
	pool, err := connect(ctx, s)
	if err != nil {
		return err
	}
	defer pool.Close()
	p := &provider{pool: pool, logger: logger}
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", s.providerAddr)
	if err != nil {
		return fmt.Errorf("provider: listen on PROVIDER_ADDR %s: %w", s.providerAddr, err)
	}
	srv := &http.Server{Handler: p.routes(), ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	logger.Info("provider: listening", "addr", ln.Addr().String())
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("provider: %w", err)
	}
	return nil
}
