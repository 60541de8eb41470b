// Package explain answers "was this message applied, and what did it
// emit?" for one (consumer, key): its claim, the transaction that wrote
// the claim, the outbox rows that transaction wrote with their publish
// status, and its poison memo. `claimtx explain` prints it; the web
// console reuses it.
//
// The transaction id comes from the xact column (migration 005), which
// claims and outbox rows get by default (pg_current_xact_id()). Rows
// written before that migration have none: their transaction is unknown,
// and so are its outbox rows.
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
	"github.com/claimtx/claimtx/internal/poison"
)

// Report is what is known of one (consumer, key).
type Report struct {
	Consumer string `json:"consumer"`
	Key      string `json:"key"`
	// Claim is nil when there is no claim: never applied by this
	// consumer, or removed by retention.
	Claim *Claim `json:"claim"`
	// Outbox lists the rows written in the claim's transaction, oldest
	// first; nil when the transaction is unknown or no outbox table exists.
	// In batch mode the transaction is the batch's: its rows are those of
	// every message of the batch.
	Outbox []OutboxRow `json:"outbox"`
	// Memo is the poison memo, nil when there is none.
	Memo *poison.Memo `json:"poison_memo"`
}

// Found reports whether anything is known: a claim or a poison memo.
func (r Report) Found() bool { return r.Claim != nil || r.Memo != nil }

// Claim is a claim row.
type Claim struct {
	ProcessedAt time.Time `json:"processed_at"`
	// EventDay is the claim's event day (UTC) when the claim table carries
	// one (partitioned by event day, or prepared for it) and the claim was
	// made with an event time; nil otherwise.
	EventDay *time.Time `json:"event_day,omitempty"`
	// Partition is the day partition (or the legacy partition) holding
	// the claim; "" on a plain claim table.
	Partition string `json:"partition,omitempty"`
	// Fingerprint says whether a payload fingerprint was stored with the
	// claim (middleware.Claim.Fingerprint).
	Fingerprint bool `json:"fingerprint"`
	// Transaction is the id (pg_current_xact_id) of the transaction that
	// wrote the claim; nil when unknown (claimed before migration 005).
	Transaction *uint64 `json:"transaction"`
}

// OutboxRow is an outbox row as explain shows it: its payload and
// metadata are left out (they may be large, or sensitive).
type OutboxRow struct {
	ID        int64      `json:"id"`
	Topic     string     `json:"topic"`
	CreatedAt time.Time  `json:"created_at"`
	SentAt    *time.Time `json:"sent_at,omitempty"`
	// Status is "sent", "pending" (not published yet) or "failing"
	// (pending, with failed publish attempts).
	Status    string `json:"status"`
	Attempts  int    `json:"attempts"`
	LastError string `json:"last_error,omitempty"`
}

// Explain reads what is known of (consumer, key) in the tables n names.
// Tables missing from an older schema (no memo table, no outbox table, no
// xact column) read as "nothing known", not as an error.
func Explain(ctx context.Context, db poison.DB, n *pg.Names, consumer, key string) (Report, error) {
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
	ok, err := poison.MemoTableExists(ctx, db, n)
	if err != nil || !ok {
		return r, err
	}
	m, ok, err := poison.GetMemo(ctx, db, n, consumer, key)
	if err != nil {
		return r, err
	}
	if ok {
		r.Memo = &m
	}
	return r, nil
}

func readClaim(ctx context.Context, db poison.DB, n *pg.Names, consumer, key string) (*Claim, error) {
	var (
		c         Claim
		day, xact pgtype.Text
		partition string
	)
	// The optional columns through to_jsonb, so that a claim table
	// without them (not prepared for partitions, not migrated to 005)
	// reads them as NULL instead of failing. tableoid names the partition.
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

// readOutbox lists the outbox rows written by transaction xact. The outbox
// has no index on xact (building one would lock it on a busy table, and
// every enqueue would maintain it for an operator's question), so the
// scan is bounded by the indexes it has: the pending rows (a small partial
// index), and the rows sent since the claim, through the partial index on
// sent_at. A row of the claim's transaction cannot have been sent before
// that transaction began (processedAt, its start); the cost is the outbox
// traffic since the claim, within the outbox retention.
func readOutbox(ctx context.Context, db poison.DB, n *pg.Names, xact uint64, processedAt time.Time) ([]OutboxRow, error) {
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
