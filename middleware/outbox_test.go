package middleware_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/internal/pg"
	"github.com/claimtx/claimtx/internal/testenv"
	"github.com/claimtx/claimtx/middleware"
	"github.com/claimtx/claimtx/store"
)

// outboxRow is a pending outbox row as the relay reads it.
type outboxRow struct {
	Topic          string
	IdempotencyKey string
	Payload        []byte
	Metadata       map[string]string
}

func (b bundle) outboxRows(t testing.TB) []outboxRow {
	t.Helper()
	cfg := b.store.Config()
	rows, err := b.pool.Query(context.Background(), "SELECT topic, idempotency_key, payload, metadata FROM "+
		pgx.Identifier{cfg.Schema, cfg.OutboxTable}.Sanitize()+" WHERE sent_at IS NULL ORDER BY id")
	require.NoError(t, err)
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (outboxRow, error) {
		var r outboxRow
		err := row.Scan(&r.Topic, &r.IdempotencyKey, &r.Payload, &r.Metadata)
		return r, err
	})
	require.NoError(t, err)
	return out
}

// receipt is what the loyalty handler of these tests returns: a message for
// the receipts service, keyed by the order.
func receipt(orderID int64, md map[string]string) *message.Message {
	m := testenv.Message(fmt.Sprintf(`{"order_id":%d}`, orderID))
	for k, v := range md {
		m.Metadata.Set(k, v)
	}
	return m
}

// creditThen is a loyalty claim with outbox topic "send-receipt" around a
// handler that credits the order in the claim transaction and then returns
// what produce returns, in the same transaction.
func (b bundle) creditThen(t *testing.T, rec *outcomes, produce func(context.Context, pgx.Tx) ([]*message.Message, error)) message.HandlerFunc {
	t.Helper()
	c := b.claim(t, "loyalty", rec)
	c.OutboxTopic = "send-receipt"
	return testenv.Install(t, middleware.NewClaim, c)(func(msg *message.Message) ([]*message.Message, error) {
		tx, ok := framework.TxFromContext(msg.Context())
		require.True(t, ok)
		if err := credit(msg.Context(), tx, msg); err != nil {
			return nil, err
		}
		return produce(msg.Context(), tx)
	})
}

func TestReturnedMessagesAreEnqueuedInTheClaimTx(t *testing.T) {
	t.Parallel()
	b := setup(t, 2)
	rec := &outcomes{}
	h := b.creditThen(t, rec, func(context.Context, pgx.Tx) ([]*message.Message, error) {
		return []*message.Message{
			receipt(5, map[string]string{"kind": "send_receipt"}),
			receipt(5, map[string]string{middleware.OutboxTopicMetadata: "audit"}),
		}, nil
	})
	o := order{OrderID: 5, CustomerID: 5, TotalCents: 500}
	produced, err := h(newDelivery(t, o))
	require.NoError(t, err)
	require.Empty(t, produced, "the router must never publish them itself")
	// The redelivery is a duplicate: the handler does not run, nothing more
	// is enqueued.
	_, err = h(newDelivery(t, o))
	require.NoError(t, err)

	rec.requireFirst(t, framework.Applied, framework.Duplicate)
	require.Equal(t, 2, rec.results[0].Enqueued)
	require.Equal(t, 0, rec.results[1].Enqueued)
	rows := b.outboxRows(t)
	require.Len(t, rows, 2)
	require.Equal(t, "send-receipt", rows[0].Topic)
	require.Equal(t, map[string]string{"kind": "send_receipt"}, rows[0].Metadata)
	require.Equal(t, `{"order_id":5}`, string(rows[0].Payload))
	require.Equal(t, "audit", rows[1].Topic)
	require.Empty(t, rows[1].Metadata, "the topic override is not kept in the message")
	require.NotEqual(t, rows[0].IdempotencyKey, rows[1].IdempotencyKey)
}

// Whatever ends a delivery without a commit (a failed COMMIT included)
// leaves no outbox row, and a Result that counts none: the message exists
// if and only if the effect does.
func TestRolledBackDeliveryLeavesNoOutboxRow(t *testing.T) {
	t.Parallel()
	errBoom := errors.New("boom")
	for _, tc := range []struct {
		name    string
		outcome framework.Outcome
		after   func(context.Context, pgx.Tx) error // runs after the handler enqueued
	}{
		{"error", framework.Failed, func(context.Context, pgx.Tx) error { return errBoom }},
		{"panic", framework.Failed, func(context.Context, pgx.Tx) error { panic("boom") }},
		{"permanent", framework.Failed, func(context.Context, pgx.Tx) error { return framework.Permanent(errBoom) }},
		{"already applied", framework.Duplicate, func(context.Context, pgx.Tx) error { return framework.ErrAlreadyApplied }},
		{"commit fails", framework.Failed, func(ctx context.Context, tx pgx.Tx) error {
			// A deferred unique constraint: every statement succeeds, COMMIT fails.
			_, err := tx.Exec(ctx, `CREATE TEMP TABLE commit_fails (id int UNIQUE DEFERRABLE INITIALLY DEFERRED) ON COMMIT DROP;
				INSERT INTO commit_fails VALUES (1), (1)`)
			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, 2)
			rec := &outcomes{}
			h := b.creditThen(t, rec, func(ctx context.Context, tx pgx.Tx) ([]*message.Message, error) {
				// Both ways of producing: Enqueue in the handler, and
				// returned messages.
				if err := b.store.Enqueue(ctx, tx, "direct", receipt(6, nil)); err != nil {
					return nil, err
				}
				return []*message.Message{receipt(6, nil)}, tc.after(ctx, tx)
			})
			_, err := h(newDelivery(t, order{OrderID: 6, CustomerID: 6, TotalCents: 600}))
			if tc.outcome == framework.Failed {
				require.Error(t, err)
			} else {
				require.NoError(t, err)
			}
			require.Equal(t, tc.outcome, rec.results[0].Outcome)
			require.Zero(t, rec.results[0].Enqueued, "Enqueued is 0 unless Applied")
			require.Empty(t, b.outboxRows(t))
			require.Equal(t, int64(0), b.ledgerRows(t, 6))
			require.Equal(t, int64(0), b.claims(t, "loyalty"))
		})
	}
}

func TestEnqueueFromTxHandler(t *testing.T) {
	t.Parallel()
	b := naturalSetup(t, 2)
	c := b.natural(t, nil)
	h := testenv.Install(t, middleware.NewClaim, c)(consume(func(ctx context.Context, tx pgx.Tx, msg *message.Message) error {
		if err := creditOnce(ctx, tx, msg); err != nil {
			return err // ErrAlreadyApplied: nothing enqueued either
		}
		return b.store.Enqueue(ctx, tx, "send-receipt", receipt(7, nil))
	}))
	for i := 0; i < 3; i++ {
		_, err := h(newDelivery(t, order{OrderID: 7, CustomerID: 7, TotalCents: 700}))
		require.NoError(t, err)
	}
	rows := b.outboxRows(t)
	require.Len(t, rows, 1)
	require.Equal(t, "send-receipt", rows[0].Topic)
}

func TestInvalidReturnedMessageIsPermanent(t *testing.T) {
	t.Parallel()
	b := setup(t, 2)
	c := b.claim(t, "loyalty", nil)
	c.OutboxTopic = "send-receipt"
	for _, produced := range [][]*message.Message{
		{nil},
		{receipt(8, map[string]string{"bad": "nul\x00"})},
		{receipt(8, map[string]string{middleware.OutboxTopicMetadata: strings.Repeat("t", 300)})},
	} {
		h := testenv.Install(t, middleware.NewClaim, c)(func(msg *message.Message) ([]*message.Message, error) {
			tx, _ := framework.TxFromContext(msg.Context())
			if err := credit(msg.Context(), tx, msg); err != nil {
				return nil, err
			}
			return produced, nil
		})
		_, err := h(newDelivery(t, order{OrderID: 8, CustomerID: 8, TotalCents: 800}))
		require.ErrorIs(t, err, store.ErrInvalidOutboxMessage)
		require.True(t, framework.IsPermanent(err))
		require.Equal(t, int64(0), b.ledgerRows(t, 8))
	}
}

func TestOutboxTopicConfiguration(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	for _, topic := range []string{strings.Repeat("t", pg.MaxOutboxTopicBytes+1), "a\x00b", string([]byte{0xff})} {
		c := b.claim(t, "loyalty", nil)
		c.OutboxTopic = topic
		var ce *framework.ConfigError
		require.ErrorAs(t, configErr(middleware.NewClaim, c), &ce)
		require.Equal(t, "OutboxTopic", ce.Field)
	}
}
