// Package explain answers "was this message applied, and what did it
// emit?" for one (consumer, key): its claim, the transaction that wrote
// it (the xact column of migration 005: unknown for older rows), that
// transaction's outbox rows, and its poison memo. `claimtx explain` and
// the web console show it.
package explain

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/claimtx/claimtx/internal/pg"
	_ "github.com/claimtx/claimtx/store" // sets pg.MemosOf
)

// Report is what is known of one (consumer, key).
type Report struct {
	Consumer string `json:"consumer"`
	Key      string `json:"key"`
	Claim    *Claim `json:"claim"` // nil: never applied, or removed by retention
	// Outbox lists the rows of the claim's transaction, oldest first (in
	// batch mode those of the whole batch); nil when unknown.
	Outbox []OutboxRow `json:"outbox"`
	Memo   *pg.Memo    `json:"poison_memo"`
}

// Found reports whether a claim or a poison memo is known.
func (r Report) Found() bool { return r.Claim != nil || r.Memo != nil }

// Claim is a claim row.
type Claim struct {
	ProcessedAt time.Time  `json:"processed_at"`
	EventDay    *time.Time `json:"event_day,omitempty"` // UTC; nil without event time or column
	Partition   string     `json:"partition,omitempty"` // "" on a plain claim table
	Fingerprint bool       `json:"fingerprint"`         // a payload fingerprint was stored
	Transaction *uint64    `json:"transaction"`         // pg_current_xact_id; nil when unknown
}

// OutboxRow is an outbox row without its payload and metadata (large, or
// sensitive).
type OutboxRow struct {
	ID        int64      `json:"id"`
	Topic     string     `json:"topic"`
	CreatedAt time.Time  `json:"created_at"`
	SentAt    *time.Time `json:"sent_at,omitempty"`
	Status    string     `json:"status"` // sent, pending, or failing (pending after failed attempts)
	Attempts  int        `json:"attempts"`
	LastError string     `json:"last_error,omitempty"`
}

// Explain reads what is known of (consumer, key) in the tables n names;
// what an older schema lacks reads as nothing known.
func Explain(ctx context.Context, db pg.DB, n *pg.Names, consumer, key string) (Report, error) {
	r := Report{Consumer: consumer, Key: key}
	var err error
	if r.Claim, err = readClaim(ctx, db, n, consumer, key); err != nil {
		return r, err
	}
	if r.Claim != nil && r.Claim.Transaction != nil {
		if r.Outbox, err = readOutbox(ctx, db, n, *r.Claim.Transaction, r.Claim.ProcessedAt); err != nil {
			return r, err
		}
	}
	memos := pg.MemosOf(db, n)
	ok, err := memos.Exists(ctx)
	if err != nil || !ok {
		return r, err
	}
	m, ok, err := memos.Get(ctx, consumer, key)
	if ok { // never with an error
		r.Memo = &m
	}
	return r, err
}

func readClaim(ctx context.Context, db pg.DB, n *pg.Names, consumer, key string) (*Claim, error) {
	var (
		c         Claim
		day, xact pgtype.Text
		partition string
	)
	// Optional columns through to_jsonb: missing ones read as NULL.
	err := db.QueryRow(ctx, n.Render(`SELECT c.processed_at, to_jsonb(c) ->> 'event_day', to_jsonb(c) ->> 'payload_hash' IS NOT NULL,
       to_jsonb(c) ->> 'xact', p.relname
FROM {schema}.{claims} c JOIN pg_class p ON p.oid = c.tableoid
WHERE c.consumer = $1 AND c.message_key = $2`), consumer, key).Scan(&c.ProcessedAt, &day, &c.Fingerprint, &xact, &partition)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("claimtx: read claim: %w", err)
	}
	// -infinity: claimed without an event time on a prepared table.
	if day.Valid && day.String != "-infinity" {
		if d, err := time.Parse(time.DateOnly, day.String); err == nil {
			c.EventDay = &d
		}
	}
	if partition != n.Claims {
		c.Partition = partition
	}
	if xact.Valid {
		id, err := strconv.ParseUint(xact.String, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("claimtx: read claim: transaction id %q: %w", xact.String, err)
		}
		c.Transaction = &id
	}
	return &c, nil
}

// readOutbox lists the outbox rows of transaction xact. Without an index
// on xact (every enqueue would maintain it for an operator's question), the
// scan is bounded by the indexes there are: pending rows, and rows sent
// since processedAt (the transaction's start, before which none of its
// rows can have been sent).
func readOutbox(ctx context.Context, db pg.DB, n *pg.Names, xact uint64, processedAt time.Time) ([]OutboxRow, error) {
	var exists bool
	if err := db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass($1) AND attname = 'xact' AND NOT attisdropped)`,
		n.Render("{schema}.{outbox}")).Scan(&exists); err != nil {
		return nil, fmt.Errorf("claimtx: inspect outbox: %w", err)
	}
	if !exists {
		return nil, nil
	}
	rows, err := db.Query(ctx, n.Render(`SELECT id, topic, created_at, sent_at, attempts, coalesce(last_error, '')
FROM {schema}.{outbox}
WHERE xact = $1::text::xid8 AND (sent_at IS NULL OR sent_at >= $2)
ORDER BY id`), strconv.FormatUint(xact, 10), processedAt)
	if err != nil {
		return nil, fmt.Errorf("claimtx: read outbox: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (OutboxRow, error) {
		var o OutboxRow
		var sent pgtype.Timestamptz
		if err := row.Scan(&o.ID, &o.Topic, &o.CreatedAt, &sent, &o.Attempts, &o.LastError); err != nil {
			return o, err
		}
		switch {
		case sent.Valid:
			o.SentAt, o.Status = &sent.Time, "sent"
		case o.Attempts > 0:
			o.Status = "failing"
		default:
			o.Status = "pending"
		}
		return o, nil
	})
	if err != nil {
		return nil, fmt.Errorf("claimtx: read outbox: %w", err)
	}
	return out, nil
}
