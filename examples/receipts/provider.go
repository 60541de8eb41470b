package main

import (
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
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/jackc/pgx/v5/pgxpool"
)

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
	receiptsPath            = "/v1/receipts"
	idempotencyKeyHeader    = "Idempotency-Key"
	idempotentReplayedValue = "true"
	idempotentReplayHeader  = "Idempotent-Replayed"
)

// provider stands in for an e-mail provider with Stripe-style idempotency:
// the first request with an Idempotency-Key sends the e-mail and stores the
// response; a later request with the same key gets the stored response and
// sends nothing; the same key with a different body is refused (422),
// because it means the caller reused a key for another e-mail. It keeps
// its state in Postgres so that it survives restarts, like a real one.
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
		w.Header().Set(idempotentReplayHeader, idempotentReplayedValue)
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
