package middleware_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/internal/testenv"
	"github.com/claimtx/claimtx/middleware"
)

// naturalSetup is setup with the seed's step 4: the ledger row itself is
// the idempotency record, one ledger entry per order.
func naturalSetup(t *testing.T, maxConns int32) bundle {
	t.Helper()
	b := setup(t, maxConns)
	b.exec(t, "ALTER TABLE point_ledger ADD CONSTRAINT one_credit_per_order UNIQUE (order_id)")
	return b
}

// creditOnceSQL is the seed's CTE: the balance moves only if the ledger
// insert happened. The balance is upserted (the seed's UPDATE … FROM would
// silently skip a customer without a balance row yet), and the statement
// returns whether the ledger row is new, never the balance's row count.
const creditOnceSQL = `
WITH credit AS (
  INSERT INTO point_ledger (customer_id, order_id, points) VALUES ($1, $2, $3)
  ON CONFLICT (order_id) DO NOTHING
  RETURNING customer_id, points
), balance AS (
  INSERT INTO balances (customer_id, points) SELECT customer_id, points FROM credit
  ON CONFLICT (customer_id) DO UPDATE SET points = balances.points + EXCLUDED.points
)
SELECT count(*) FROM credit`

// creditOnce is the loyalty effect in natural-key mode.
func creditOnce(ctx context.Context, tx pgx.Tx, msg *message.Message) error {
	var o order
	if err := json.Unmarshal(msg.Payload, &o); err != nil {
		return framework.Permanent(err)
	}
	var inserted int
	if err := tx.QueryRow(ctx, creditOnceSQL, o.CustomerID, o.OrderID, o.TotalCents/100).Scan(&inserted); err != nil {
		return err
	}
	if inserted == 0 {
		return framework.ErrAlreadyApplied
	}
	return nil
}

func (b bundle) natural(t testing.TB, rec *outcomes) middleware.Claim {
	c := middleware.Claim{Store: b.store, Consumer: "loyalty", Mode: middleware.ModeNaturalKey}
	if rec != nil {
		c.OnOutcome = rec.onOutcome
		c.OnRetry = rec.onRetry
	}
	require.NoError(t, configErr(middleware.NewClaim, c))
	return c
}

func TestNaturalKeyRedeliveryAppliesOnce(t *testing.T) {
	t.Parallel()
	b := naturalSetup(t, 4)
	rec := &outcomes{}
	h := testenv.Install(t, middleware.NewClaim, b.natural(t, rec))(consume(creditOnce))
	o := order{OrderID: 9912, CustomerID: 7, TotalCents: 5000}

	for i := 0; i < 3; i++ {
		_, err := h(newDelivery(t, o))
		require.NoError(t, err)
	}
	require.Equal(t, 1, rec.count(framework.Applied))
	require.Equal(t, 2, rec.count(framework.Duplicate))
	require.Equal(t, int64(50), b.balance(t, 7))
	require.Equal(t, int64(1), b.ledgerRows(t, 9912))
	require.Equal(t, int64(0), b.claims(t, "loyalty"), "natural-key mode writes no claim row")
	for _, r := range rec.results {
		require.Equal(t, "loyalty", r.Consumer)
		require.Equal(t, 1, r.Attempts)
		require.NoError(t, r.Err)
		require.Empty(t, r.Key, "no Key configured")
	}
}

// naturalTwins delivers n copies of one order at once, each on its own
// connection, in natural-key mode.
func naturalTwins(t *testing.T, b bundle, n int, iso pgx.TxIsoLevel) *outcomes {
	t.Helper()
	rec := &outcomes{}
	c := b.natural(t, rec)
	c.Isolation = iso
	c.MaxAttempts = 10
	deliverTwins(t, b, testenv.Install(t, middleware.NewClaim, c), creditOnce, rec, n)
	return rec
}

func TestNaturalKeyConcurrentTwins8(t *testing.T) {
	t.Parallel()
	naturalTwins(t, naturalSetup(t, 8), 8, pgx.ReadCommitted)
}

// Not parallel: 64 connections is most of the server's 100, shared with
// every other package's tests. The pool is closed as soon as the test is
// done with it.
func TestNaturalKeyConcurrentTwins64(t *testing.T) {
	testenv.SkipBehindPooler(t, "64 twins waiting at once need 64 server connections; a transaction pooler gives a test's role its pool size by design")
	b := naturalSetup(t, 64)
	defer b.pool.Close()
	naturalTwins(t, b, 64, pgx.ReadCommitted)
}

func TestNaturalKeySerializableTwinsRetryTransparently(t *testing.T) {
	t.Parallel()
	rec := naturalTwins(t, naturalSetup(t, 8), 8, pgx.Serializable)
	rec.requireSerializationRetries(t)
}

// The wait behind an uncommitted twin's ledger entry is bounded by
// MaxClaimWait and retried like the claim table's, then given up.
func TestNaturalKeyClaimWaitIsBoundedAndRetried(t *testing.T) {
	t.Parallel()
	b := naturalSetup(t, 4)
	rec := &outcomes{}
	c := b.natural(t, rec)
	c.MaxClaimWait = 20 * time.Millisecond
	c.MaxAttempts = 3
	o := order{OrderID: 78, CustomerID: 3, TotalCents: 900}

	ctx := context.Background()
	holder := b.hold(t)
	_, err := holder.Exec(ctx, "INSERT INTO point_ledger (customer_id, order_id, points) VALUES (3, 78, 9)")
	require.NoError(t, err)

	h := testenv.Install(t, middleware.NewClaim, c)(consume(creditOnce))
	_, err = h(newDelivery(t, o))
	requireClaimWait(t, err)
	require.Len(t, rec.retries, 2)
	require.Equal(t, framework.Failed, rec.results[0].Outcome)
	require.Equal(t, 3, rec.results[0].Attempts)

	// The holder rolls back: the next delivery takes over and applies.
	require.NoError(t, holder.Rollback(ctx))
	_, err = h(newDelivery(t, o))
	require.NoError(t, err)
	require.Equal(t, framework.Applied, rec.results[1].Outcome)
	require.Equal(t, int64(9), b.balance(t, 3))

	// The handler's own statements do not keep the bound after the
	// transaction: the session default is back.
	var lt string
	require.NoError(t, b.pool.QueryRow(ctx, "SHOW lock_timeout").Scan(&lt))
	require.Equal(t, "0", lt)
}

// A duplicate rolls back whatever else the delivery wrote before finding
// out, exactly as if the handler had not run.
func TestAlreadyAppliedRollsBackTheDelivery(t *testing.T) {
	t.Parallel()
	for _, mode := range []middleware.ClaimMode{middleware.ModeNaturalKey, middleware.ModeClaimTable} {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			b := naturalSetup(t, 2)
			b.exec(t, "CREATE TABLE audit (order_id bigint NOT NULL)")
			rec := &outcomes{}
			c := b.claim(t, "loyalty", rec)
			c.Mode = mode
			h := testenv.Install(t, middleware.NewClaim, c)(consume(func(ctx context.Context, tx pgx.Tx, msg *message.Message) error {
				if _, err := tx.Exec(ctx, "INSERT INTO audit VALUES (1)"); err != nil {
					return err
				}
				return fmt.Errorf("credit: %w", creditOnce(ctx, tx, msg))
			}))
			o := order{OrderID: 1, CustomerID: 1, TotalCents: 300}
			// Pretend an earlier process credited the order (in claim-table
			// mode: under another claim, so the claim table cannot tell).
			b.exec(t, "INSERT INTO point_ledger VALUES (1, 1, 3)")

			_, err := h(newDelivery(t, o))
			require.NoError(t, err)
			require.Equal(t, framework.Duplicate, rec.results[0].Outcome)
			require.NoError(t, rec.results[0].Err)
			require.Equal(t, "order-completed:1", rec.results[0].Key, "a configured Key is reported in both modes")
			require.Equal(t, int64(0), b.scalar(t, "SELECT count(*) FROM audit"))
			require.Equal(t, int64(0), b.claims(t, "loyalty"), "the claim row rolls back with the rest")
			require.Equal(t, int64(0), b.balance(t, 1))
		})
	}
}

func TestNaturalKeyHandlerFailureLeavesNothing(t *testing.T) {
	t.Parallel()
	b := naturalSetup(t, 2)
	rec := &outcomes{}
	fail := true
	h := testenv.Install(t, middleware.NewClaim, b.natural(t, rec))(consume(failAfter(creditOnce, &fail, func() error {
		return errors.New("boom after the guarded insert")
	})))
	o := order{OrderID: 2, CustomerID: 2, TotalCents: 400}
	_, err := h(newDelivery(t, o))
	require.Error(t, err)
	require.Equal(t, int64(0), b.ledgerRows(t, 2), "the natural claim rolls back with the effect")
	fail = false
	b.requireRetryApplies(t, h, rec, o)
}

// In natural-key mode a configured Key still validates messages.
func TestNaturalKeyInvalidKeyIsPermanent(t *testing.T) {
	t.Parallel()
	b := naturalSetup(t, 2)
	c := b.natural(t, nil)
	c.Key = keyFunc(t)
	msg := newDelivery(t, order{})
	msg.Payload = []byte(`{"customer_id": 1}`)
	_, err := testenv.Install(t, middleware.NewClaim, c)(consume(creditOnce))(msg)
	require.ErrorAs(t, err, new(*framework.KeyError))
	require.True(t, framework.IsPermanent(err))
}

func TestModeConfiguration(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	c := b.claim(t, "loyalty", nil)
	c.Mode = "natural"
	var ce *framework.ConfigError
	require.ErrorAs(t, configErr(middleware.NewClaim, c), &ce)
	require.Equal(t, "Mode", ce.Field)
	c.Mode, c.Key = middleware.ModeClaimTable, nil
	require.ErrorAs(t, configErr(middleware.NewClaim, c), &ce)
	require.Equal(t, "Key", ce.Field)
	c.Mode = middleware.ModeNaturalKey
	require.NoError(t, configErr(middleware.NewClaim, c), "natural-key mode needs no Key")
}
