package store

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/claimtx/claimtx/internal/kafkarecord"
	"github.com/claimtx/claimtx/internal/pg"
	"github.com/claimtx/claimtx/internal/poison"
	"github.com/claimtx/claimtx/store/internal/claimsql"
	"github.com/claimtx/claimtx/store/internal/deadletter"
)

// The claim middleware and framework/consumer claim and store Kafka
// positions through pg.Claims, which claims implements on a Store: the
// statements stay here, and none of this plumbing is exported.
func init() {
	pg.ClaimsOf = func(s any) pg.Claims { return claims{s.(*Store)} }
}

type claims struct{ s *Store }

func (c claims) Begin(ctx context.Context, opts pgx.TxOptions, r pg.ClaimRequest, withMemo bool, more func(*pgx.Batch)) (pgx.Tx, pg.ClaimResult, *string, error) {
	return c.s.claims.Begin(ctx, c.s.pool, opts, r, withMemo, more)
}

func (c claims) BeginBatch(ctx context.Context, opts pgx.TxOptions, consumer string, keys []string, maxClaimWait time.Duration, withMemo bool) (pgx.Tx, []string, map[string]string, error) {
	return c.s.claims.BeginBatch(ctx, c.s.pool, opts, consumer, keys, maxClaimWait, withMemo)
}

func (c claims) BeginNaturalKey(ctx context.Context, opts pgx.TxOptions, maxClaimWait time.Duration, more func(*pgx.Batch)) (pgx.Tx, error) {
	return claimsql.BeginNaturalKey(ctx, c.s.pool, opts, maxClaimWait, more)
}

func (c claims) Following(ctx context.Context, consumer string, anchors []string, n int, add func(key string)) error {
	return c.s.claims.Following(ctx, c.s.pool, consumer, anchors, n, add)
}

func (c claims) Positions() pg.Positions {
	return positions{s: c.s, stmts: c.s.positions}
}

type positions struct {
	s     *Store
	stmts *claimsql.PositionStatements
}

func (p positions) Queue(b *pgx.Batch, consumer string, pos kafkarecord.Settled) {
	p.stmts.Queue(b, consumer, pos)
}

func (p positions) Store(ctx context.Context, db pg.Execer, consumer string, ps []kafkarecord.Settled) error {
	return p.stmts.Store(ctx, db, consumer, ps)
}

func (p positions) Of(ctx context.Context, consumer string) ([]kafkarecord.Settled, error) {
	return p.stmts.Of(ctx, p.s.pool, consumer)
}

func (p positions) Loader(consumer string) kafkarecord.Loader {
	return claimsql.Loader{Pool: p.s.pool, Stmts: p.stmts, Consumer: consumer}
}

func (c claims) RecordMemo(ctx context.Context, consumer, key string, err error) error {
	return poison.RecordMemo(ctx, c.s.pool, c.s.names, consumer, key, err)
}

func (c claims) RecordDeadLetter(ctx context.Context, l pg.DeadLetter) error {
	return deadletter.Record(ctx, c.s.pool, c.s.names, l)
}

func (c claims) CanRecordDeadLetter(ctx context.Context) (bool, error) {
	return deadletter.CanRecord(ctx, c.s.pool, c.s.names)
}
