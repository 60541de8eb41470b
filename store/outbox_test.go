package store_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/internal/pg"
	"github.com/claimtx/claimtx/internal/testenv"
	"github.com/claimtx/claimtx/store"
)

func msg(uuid, payload string, md map[string]string) *message.Message {
	m := message.NewMessage(uuid, []byte(payload))
	for k, v := range md {
		m.Metadata.Set(k, v)
	}
	return m
}

func TestEnqueueCommitsWithTheTransaction(t *testing.T) {
	t.Parallel()
	st := migrated(t, 4)
	ctx := context.Background()

	// Rolled back: nothing.
	err := pgx.BeginFunc(ctx, st.Pool(), func(tx pgx.Tx) error {
		require.NoError(t, st.Enqueue(ctx, tx, "receipts", msg("u0", "lost", nil)))
		return errors.New("handler failed")
	})
	require.Error(t, err)
	stats, err := st.OutboxStats(ctx)
	require.NoError(t, err)
	require.Equal(t, store.OutboxStats{}, stats)

	// Committed: in order, with metadata, a generated idempotency key
	// unless the message brought its own, and a UUID when it had none.
	require.NoError(t, pgx.BeginFunc(ctx, st.Pool(), func(tx pgx.Tx) error {
		if err := st.Enqueue(ctx, tx, "receipts",
			msg("u1", `{"n":1}`, map[string]string{"event_id": "e1"}),
			msg("u2", "", map[string]string{store.IdempotencyKeyMetadata: "receipt:9912"}),
		); err != nil {
			return err
		}
		return st.Enqueue(ctx, tx, "audit", msg("", "x", nil))
	}))
	stats, err = st.OutboxStats(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(3), stats.Pending)
	require.Positive(t, stats.OldestPending)

	tx, err := st.Pool().Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx)
	rows, err := st.OutboxForTest().LockPending(ctx, tx, 10)
	require.NoError(t, err)
	require.Len(t, rows, 3)
	require.Equal(t, []string{"receipts", "receipts", "audit"}, []string{rows[0].Topic, rows[1].Topic, rows[2].Topic})
	require.Less(t, rows[0].ID, rows[1].ID)
	require.Equal(t, "u1", rows[0].UUID)
	require.Equal(t, `{"n":1}`, string(rows[0].Payload))
	require.Equal(t, map[string]string{"event_id": "e1"}, rows[0].Metadata)
	require.NotEmpty(t, rows[0].IdempotencyKey)
	require.Equal(t, "receipt:9912", rows[1].IdempotencyKey)
	require.Empty(t, rows[1].Metadata, "the idempotency key lives in its column, not twice")
	require.Equal(t, []byte{}, rows[1].Payload)
	require.NotEmpty(t, rows[2].UUID)

	m := rows[0].Message()
	require.Equal(t, "u1", m.UUID)
	require.Equal(t, rows[0].IdempotencyKey, m.Metadata.Get(store.IdempotencyKeyMetadata))
	require.Equal(t, "e1", m.Metadata.Get("event_id"))
	// The key is stable: the same row gives the same message again.
	require.Equal(t, m.Metadata, rows[0].Message().Metadata)
}

func TestEnqueueRefusesWhatNoBrokerTakes(t *testing.T) {
	t.Parallel()
	st := migrated(t, 2)
	ctx := context.Background()
	for _, tc := range []struct {
		name  string
		topic string
		m     *message.Message
	}{
		{"empty topic", "", msg("u", "", nil)},
		{"long topic", strings.Repeat("t", pg.MaxOutboxTopicBytes+1), msg("u", "", nil)},
		{"NUL topic", "a\x00b", msg("u", "", nil)},
		{"nil message", "t", nil},
		{"NUL metadata", "t", msg("u", "", map[string]string{"k": "a\x00"})},
		{"invalid UTF-8 metadata", "t", msg("u", "", map[string]string{string([]byte{0xff}): "v"})},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tx, err := st.Pool().Begin(ctx)
			require.NoError(t, err)
			defer tx.Rollback(ctx)
			err = st.Enqueue(ctx, tx, tc.topic, tc.m)
			require.ErrorIs(t, err, store.ErrInvalidOutboxMessage)
			require.True(t, framework.IsPermanent(err))
		})
	}
	require.Error(t, st.Enqueue(ctx, nil, "t", msg("u", "", nil)))
	require.NoError(t, pgx.BeginFunc(ctx, st.Pool(), func(tx pgx.Tx) error { return st.Enqueue(ctx, tx, "t") }))
}

// Two relay transactions never hold the same row: the second skips what
// the first locked instead of waiting for it.
func TestLockPendingSkipsLockedRows(t *testing.T) {
	t.Parallel()
	st := migrated(t, 4)
	ctx := context.Background()
	require.NoError(t, pgx.BeginFunc(ctx, st.Pool(), func(tx pgx.Tx) error {
		for i := 0; i < 5; i++ {
			if err := st.Enqueue(ctx, tx, "t", msg("", "p", nil)); err != nil {
				return err
			}
		}
		return nil
	}))
	tx1, err := st.Pool().Begin(ctx)
	require.NoError(t, err)
	defer tx1.Rollback(ctx)
	tx2, err := st.Pool().Begin(ctx)
	require.NoError(t, err)
	defer tx2.Rollback(ctx)

	a, err := st.OutboxForTest().LockPending(ctx, tx1, 3)
	require.NoError(t, err)
	b, err := st.OutboxForTest().LockPending(ctx, tx2, 10)
	require.NoError(t, err)
	require.Len(t, a, 3)
	require.Len(t, b, 2)
	require.Greater(t, b[0].ID, a[2].ID)

	// tx1 marks its rows sent; tx2 records a failed publish of one row.
	require.NoError(t, st.OutboxForTest().MarkSent(ctx, tx1, []int64{a[0].ID, a[1].ID, a[2].ID}))
	require.NoError(t, st.OutboxForTest().MarkFailed(ctx, tx1, nil, nil))
	require.NoError(t, tx1.Commit(ctx))
	require.NoError(t, st.OutboxForTest().MarkFailed(ctx, tx2, []int64{b[0].ID}, errors.New("broker down")))
	require.NoError(t, tx2.Commit(ctx))

	stats, err := st.OutboxStats(ctx)
	require.NoError(t, err)
	require.Equal(t, store.OutboxStats{Pending: 2, Sent: 3, Failing: 1, OldestPending: stats.OldestPending}, stats)

	_, err = st.OutboxForTest().LockPending(ctx, tx2, 0)
	require.Error(t, err)
	_, err = st.OutboxForTest().LockPending(ctx, nil, 1)
	require.Error(t, err)
}

func TestDeleteSentOutboxInBatches(t *testing.T) {
	t.Parallel()
	st := migrated(t, 2)
	ctx := context.Background()
	require.NoError(t, pgx.BeginFunc(ctx, st.Pool(), func(tx pgx.Tx) error {
		ms := make([]*message.Message, 25)
		for i := range ms {
			ms[i] = msg("", "p", nil)
		}
		return st.Enqueue(ctx, tx, "t", ms...)
	}))
	require.NoError(t, pgx.BeginFunc(ctx, st.Pool(), func(tx pgx.Tx) error {
		rows, err := st.OutboxForTest().LockPending(ctx, tx, 20)
		if err != nil {
			return err
		}
		ids := make([]int64, len(rows))
		for i, r := range rows {
			ids[i] = r.ID
		}
		return st.OutboxForTest().MarkSent(ctx, tx, ids)
	}))

	// Not old enough yet.
	n, err := st.OutboxForTest().DeleteSent(ctx, st.Pool(), time.Hour, 100)
	require.NoError(t, err)
	require.Zero(t, n)

	var total int64
	for {
		n, err := st.OutboxForTest().DeleteSent(ctx, st.Pool(), 0, 8)
		require.NoError(t, err)
		total += n
		if n < 8 {
			break
		}
	}
	require.Equal(t, int64(20), total)
	stats, err := st.OutboxStats(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(5), stats.Pending, "pending rows are never cleaned up")
	require.Zero(t, stats.Sent)
	_, err = st.OutboxForTest().DeleteSent(ctx, st.Pool(), 0, 0)
	require.Error(t, err)
}

// Enqueue notifies listening relays when, and only when, the transaction
// commits.
func TestEnqueueNotifiesAtCommit(t *testing.T) {
	t.Parallel()
	st := migrated(t, 2)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, testenv.URL())
	require.NoError(t, err)
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, "LISTEN "+pg.OutboxChannel)
	require.NoError(t, err)

	tx, err := st.Pool().Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, st.Enqueue(ctx, tx, "t", msg("", "p", nil)))
	require.NoError(t, tx.Rollback(ctx))
	require.NoError(t, pgx.BeginFunc(ctx, st.Pool(), func(tx pgx.Tx) error {
		return st.Enqueue(ctx, tx, "t", msg("", "p", nil))
	}))

	// Other tests' stores notify on the same channel: wait for ours.
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for {
		n, err := conn.WaitForNotification(wctx)
		require.NoError(t, err)
		if n.Payload == pg.OutboxPayload(st.Config().Schema, st.Config().OutboxTable) {
			break
		}
	}
	stats, err := st.OutboxStats(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(1), stats.Pending)
}

func TestOutboxTableName(t *testing.T) {
	t.Parallel()
	pool, schema := testenv.Setup(t, 2)
	ctx := context.Background()
	st, err := store.New(pool, store.Config{Schema: schema, OutboxTable: "my_outbox"})
	require.NoError(t, err)
	require.NoError(t, st.Migrate(ctx))
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return st.Enqueue(ctx, tx, "t", msg("", "p", nil)) }))
	var n int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM "+pgx.Identifier{schema, "my_outbox"}.Sanitize()).Scan(&n))
	require.Equal(t, 1, n)

	for _, cfg := range []store.Config{
		{OutboxTable: "Outbox"},
		{OutboxTable: "x; drop"},
		{OutboxTable: "processed_messages"},
		{OutboxTable: "processed_messages_poison_memo"},
		{OutboxTable: "processed_messages_dead_letter"},
	} {
		_, err := store.New(pool, cfg)
		var ce *framework.ConfigError
		require.ErrorAs(t, err, &ce)
		require.Equal(t, "OutboxTable", ce.Field)
	}
}
