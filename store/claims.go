package store

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/claimtx/claimtx/internal/pg"
	"github.com/claimtx/claimtx/store/internal/claimsql"
	"github.com/claimtx/claimtx/store/internal/poisonsql"
	"github.com/claimtx/claimtx/store/internal/standby"
)

// The claim middleware and framework/consumer claim through pg.Claims,
// implemented here so that none of this plumbing is exported.
func init() {
	pg.ClaimsOf = func(s any) pg.Claims { return claims{s.(*Store).claims, s.(*Store)} }
	pg.ParkingOf = func(s any) pg.Parking { return s.(*Store).parking }
	pg.MemosOf = poisonsql.Memos
}

// claims adds the memo and dead-letter records to the claim statements.
type claims struct {
	*claimsql.Statements // Begin, BeginBatch, Following
	s                    *Store
}

func (c claims) BeginNaturalKey(ctx context.Context, opts pg.TxOptions, maxClaimWait time.Duration, more func(*pgx.Batch)) (pgx.Tx, error) {
	return claimsql.BeginNaturalKey(ctx, c.s.pool, opts, maxClaimWait, more)
}

func (c claims) Positions() pg.Positions { return c.s.positions }

func (c claims) RecordMemo(ctx context.Context, consumer, key string, err error) error {
	return poisonsql.Memos(c.s.pool, c.s.names).Record(ctx, consumer, key, err)
}

func (c claims) Lacking(ctx context.Context, table string, privileges ...string) (bool, []string, error) {
	return poisonsql.Lacking(ctx, c.s.pool, pg.Ident(c.s.cfg.Schema, table), privileges...)
}

func (c claims) RecordDeadLetter(ctx context.Context, l pg.DeadLetter) error {
	return poisonsql.Record(ctx, c.s.pool, c.s.names, l)
}

func (c claims) CanRecordDeadLetter(ctx context.Context) (bool, error) {
	return poisonsql.CanRecord(ctx, c.s.pool, c.s.names)
}

func (c claims) SyncStandby(ctx context.Context, synchronousCommit string) (string, bool, error) {
	if !pg.NeedsSyncStandby(synchronousCommit) {
		return "", true, nil
	}
	st, err := standby.Read(ctx, c.s.pool)
	if err != nil {
		return "", false, err
	}
	shortfall, verified := st.Shortfall(synchronousCommit)
	return shortfall, verified, nil
}
