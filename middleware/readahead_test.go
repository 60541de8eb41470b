package middleware_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"golang.org/x/sync/errgroup"

	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/internal/testenv"
	"github.com/claimtx/claimtx/middleware"
	"github.com/claimtx/claimtx/store"
)

// applyInOrder writes the claims of orders first..last-1 for consumer as a
// consumer that applied them one by one would: one committed claim each,
// a millisecond apart, an hour ago.
func (b bundle) applyInOrder(t *testing.T, consumer string, first, last int) {
	t.Helper()
	_, err := b.pool.Exec(context.Background(), `INSERT INTO `+pgx.Identifier{b.schema, "processed_messages"}.Sanitize()+`
		(consumer, message_key, processed_at)
		SELECT $1, 'order-completed:' || g, now() - interval '1 hour' + g * interval '1 millisecond'
		FROM generate_series($2::int, $3::int - 1) g`, consumer, first, last)
	require.NoError(t, err)
}

// coldReplay is a bundle whose consumer "replay" applied orders
// first..n-1 before, one by one, and a claim for it on a pool whose round
// trips are counted.
func coldReplay(t *testing.T, maxConns int32, n int) (bundle, *roundTrips, *outcomes, middleware.Claim) {
	t.Helper()
	b := setup(t, maxConns)
	b.applyInOrder(t, "replay", 0, n)
	base, rt, rec := tracedClaim(t, b, "replay")
	return b, rt, rec, base
}

// deliverAll delivers a fresh copy of each order in turn and returns the
// round trips they cost.
func deliverAll(t *testing.T, h message.HandlerFunc, rt *roundTrips, ids []int) int64 {
	t.Helper()
	before := rt.n.Load()
	for _, id := range ids {
		_, err := h(newDelivery(t, order{OrderID: int64(id), CustomerID: 1, TotalCents: 100}))
		require.NoError(t, err)
	}
	return rt.n.Load() - before
}

// orderIDs is 0..n-1, the orders coldReplay applied.
func orderIDs(n int) []int {
	ids := make([]int, n)
	for i := range ids {
		ids[i] = i
	}
	return ids
}

// A replay that starts cold (a group reset: the group is stopped first, so
// every consumer starts with an empty cache) costs a round trip per
// duplicate only until the read-ahead finds the claims that follow.
func TestReadAheadAnswersColdReplay(t *testing.T) {
	t.Parallel()
	const n = 3000
	b, rt, rec, c := coldReplay(t, 4, n)
	h := install(t, middleware.NewClaim, c)(consume(credit))
	trips := deliverAll(t, h, rt, orderIDs(n))
	require.Equal(t, n, rec.count(framework.Duplicate))
	require.Zero(t, b.ledgerRows(t, 0)+b.scalar(t, "SELECT count(*) FROM point_ledger"), "a replay applies nothing")
	// Without the read-ahead: 2 per message (BEGIN+claim, COMMIT), 6,000.
	require.Less(t, trips, int64(n/20), "round trips for %d duplicates", n)
}

// The read-ahead caches only committed claims: a claim in the window whose
// transaction is still open is left to the database, and once it rolls
// back its message is applied.
func TestReadAheadSkipsUncommittedClaims(t *testing.T) {
	t.Parallel()
	b := setup(t, 4)
	b.applyInOrder(t, "replay", 0, 50)
	b.applyInOrder(t, "replay", 51, 100)
	ctx := context.Background()
	twin := b.hold(t)
	// Order 50's claim, uncommitted, in its place in time.
	_, err := twin.Exec(ctx, `INSERT INTO `+pgx.Identifier{b.schema, "processed_messages"}.Sanitize()+`
		(consumer, message_key, processed_at) VALUES ('replay', 'order-completed:50', now() - interval '1 hour' + 50 * interval '1 millisecond')`)
	require.NoError(t, err)

	base, rt, rec := tracedClaim(t, b, "replay")
	h := install(t, middleware.NewClaim, base)(consume(credit))
	deliver := func(id int) middleware.Result {
		_, err := h(newDelivery(t, order{OrderID: int64(id), CustomerID: 1, TotalCents: 100}))
		require.NoError(t, err)
		rec.mu.Lock()
		defer rec.mu.Unlock()
		return rec.results[len(rec.results)-1]
	}
	for i := range 10 {
		require.Equal(t, framework.Duplicate, deliver(i).Outcome)
	}
	// The read-ahead ran: the rest of the window is answered in process.
	before := rt.n.Load()
	for i := 10; i < 50; i++ {
		require.Equal(t, framework.Duplicate, deliver(i).Outcome)
	}
	require.Zero(t, rt.n.Load()-before, "orders 10..49 were read ahead")

	require.NoError(t, twin.Rollback(ctx))
	res := deliver(50)
	require.Equal(t, framework.Applied, res.Outcome, "an uncommitted claim was cached")
	require.Equal(t, int64(1), b.ledgerRows(t, 50))
	for i := 51; i < 100; i++ {
		require.Equal(t, framework.Duplicate, deliver(i).Outcome)
	}
}

// Duplicates now and then among new messages (a redelivery after a
// rebalance) do not read ahead: each costs its usual two round trips.
func TestReadAheadNotForScatteredDuplicates(t *testing.T) {
	t.Parallel()
	_, rt, rec, c := coldReplay(t, 4, 1000)
	h := install(t, middleware.NewClaim, c)(consume(credit))
	next := 1000
	for i := range 700 {
		n, res := deliverCounting(t, h, rt, rec, order{OrderID: int64(i), CustomerID: 1, TotalCents: 100})
		require.Equal(t, framework.Duplicate, res.Outcome)
		require.EqualValues(t, 2, n, "duplicate %d: BEGIN+claim, COMMIT and nothing more", i)
		if i%7 == 6 {
			n, res = deliverCounting(t, h, rt, rec, order{OrderID: int64(next), CustomerID: 1, TotalCents: 100})
			next++
			require.Equal(t, framework.Applied, res.Outcome)
			require.EqualValues(t, 4, n)
		}
	}
}

// A replay in another order than its messages were first applied in (dead
// letters replayed newest first, say) gains nothing from reading ahead:
// the reads back off, so they add little to the round trip per duplicate.
func TestReadAheadBacksOffWhenItDoesNotPay(t *testing.T) {
	t.Parallel()
	const n = 3000
	_, rt, rec, c := coldReplay(t, 4, n)
	h := install(t, middleware.NewClaim, c)(consume(credit))
	ids := orderIDs(n)
	slices.Reverse(ids)
	trips := deliverAll(t, h, rt, ids)
	require.Equal(t, n, rec.count(framework.Duplicate))
	require.GreaterOrEqual(t, trips, int64(2*n))
	require.Less(t, trips, int64(2*n+n/100), "reads that did not pay")
}

// The batch consumer reads ahead too: a cold replay in batches costs a
// round trip per read, not one per batch.
func TestReadAheadBatchReplay(t *testing.T) {
	t.Parallel()
	const n, size = 5000, 100
	b, rt, rec, c := coldReplay(t, 4, n)
	bt := newBatch(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	before := rt.n.Load()
	for first := 0; first < n; first += size {
		msgs := make([]*message.Message, size)
		for i := range msgs {
			msgs[i] = newDelivery(t, order{OrderID: int64(first + i), CustomerID: 1, TotalCents: 100})
		}
		for _, err := range bt.Process(ctx, msgs, creditSet) {
			require.NoError(t, err)
		}
	}
	trips := rt.n.Load() - before
	require.Equal(t, n, rec.count(framework.Duplicate))
	require.Zero(t, b.scalar(t, "SELECT count(*) FROM point_ledger"))
	// Without the read-ahead: 2 per batch, 100.
	require.Less(t, trips, int64(n/size), "round trips for %d batches", n/size)
}

// Concurrent handlers replaying their share each (Kafka partitions, say)
// share the reads: one read at a time, and every message still a
// duplicate.
func TestReadAheadConcurrentReplay(t *testing.T) {
	t.Parallel()
	const n, workers = 4000, 4
	b, rt, rec, c := coldReplay(t, 8, n)
	h := install(t, middleware.NewClaim, c)(consume(credit))
	before := rt.n.Load()
	var g errgroup.Group
	for w := range workers {
		g.Go(func() error {
			for i := w; i < n; i += workers {
				if _, err := h(newDelivery(t, order{OrderID: int64(i), CustomerID: 1, TotalCents: 100})); err != nil {
					return err
				}
			}
			return nil
		})
	}
	require.NoError(t, g.Wait())
	trips := rt.n.Load() - before
	require.Equal(t, n, rec.count(framework.Duplicate))
	require.Zero(t, b.scalar(t, "SELECT count(*) FROM point_ledger"))
	// While a read runs (4,096 keys, on one worker's goroutine) the other
	// workers' duplicates go to the database, as many as the scheduler
	// lets through: 36-245 round trips in 40 runs, 23-617 with both cores
	// busy elsewhere, where 423 had failed the old bound of n/10. Without
	// the read-ahead they cost 2n.
	require.Less(t, trips, int64(n/2), "round trips for %d duplicates", n)
}

// A read that fails (here: a role that may insert claims but not read
// them) changes no answer: the duplicates go to the database, the failure
// is logged, and the next read waits as after reads that did not pay.
func TestReadAheadFailureFallsBackToTheDatabase(t *testing.T) {
	t.Parallel()
	b := setup(t, 4)
	const n = 300
	b.applyInOrder(t, "replay", 0, n)
	ctx := context.Background()
	role := "ra_" + b.schema
	_, err := b.pool.Exec(ctx, fmt.Sprintf(`CREATE ROLE %[1]s LOGIN;
GRANT USAGE ON SCHEMA %[2]s TO %[1]s;
GRANT INSERT ON %[2]s.processed_messages TO %[1]s;
GRANT SELECT, INSERT, UPDATE ON %[2]s.balances, %[2]s.point_ledger TO %[1]s`, role, b.schema))
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = b.pool.Exec(context.Background(), fmt.Sprintf("DROP OWNED BY %[1]s; DROP ROLE %[1]s", role))
	})
	url, err := testenv.URLWithSearchPath(b.schema)
	require.NoError(t, err)
	cfg, err := pgxpool.ParseConfig(url)
	require.NoError(t, err)
	cfg.ConnConfig.User = role
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	st, err := store.New(pool, store.Config{Schema: b.schema})
	require.NoError(t, err)

	logs := &errorLog{}
	rec := &outcomes{}
	h := install(t, middleware.NewClaim, middleware.Claim{Store: st, Consumer: "replay", Key: keyFunc(t), OnOutcome: rec.onOutcome, Logger: logs})(consume(credit))
	for i := range n {
		_, err := h(newDelivery(t, order{OrderID: int64(i), CustomerID: 1, TotalCents: 100}))
		require.NoError(t, err)
	}
	_, err = h(newDelivery(t, order{OrderID: n, CustomerID: 1, TotalCents: 100}))
	require.NoError(t, err)
	require.Equal(t, n, rec.count(framework.Duplicate))
	require.Equal(t, 1, rec.count(framework.Applied))
	require.Equal(t, int64(1), b.scalar(t, "SELECT count(*) FROM point_ledger"))
	require.Equal(t, 1, logs.count("committed-key read-ahead failed"), "one failed read in %d duplicates", n)
}

// errorLog records the messages of Error lines.
type errorLog struct {
	watermill.NopLogger
	mu   sync.Mutex
	msgs []string
}

func (l *errorLog) Error(msg string, _ error, _ watermill.LogFields) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.msgs = append(l.msgs, msg)
}

func (l *errorLog) count(substr string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, m := range l.msgs {
		if strings.Contains(m, substr) {
			n++
		}
	}
	return n
}
