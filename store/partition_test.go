package store_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/internal/pg"
	"github.com/claimtx/claimtx/internal/testenv"
	"github.com/claimtx/claimtx/store"
)

// dbToday is the UTC day on the database clock, which partition
// maintenance uses.
func dbToday(t *testing.T, st *store.Store) time.Time {
	t.Helper()
	var d time.Time
	require.NoError(t, st.Pool().QueryRow(context.Background(), "SELECT (now() AT TIME ZONE 'UTC')::date").Scan(&d))
	return d.UTC()
}

// claimAt claims (consumer, key) at event time at in its own transaction
// and, when the claim is new, applies the effect (a ledger row) in it:
// the seed's claim-then-effect, with the event day in the claim.
func claimAt(t *testing.T, st *store.Store, consumer, key string, at time.Time) (bool, error) {
	t.Helper()
	ctx := context.Background()
	var claimed bool
	err := pgx.BeginFunc(ctx, st.Pool(), func(tx pgx.Tx) error {
		var err error
		claimed, err = claimKeyAt(ctx, st, tx, consumer, key, at, time.Second)
		if err != nil || !claimed {
			return err
		}
		_, err = tx.Exec(ctx, "INSERT INTO ledger (consumer, message_key) VALUES ($1, $2)", consumer, key)
		return err
	})
	return claimed, err
}

// requireClaimAt is claimAt that must succeed and must find the claim new
// (want true) or a duplicate.
func requireClaimAt(t *testing.T, st *store.Store, consumer, key string, at time.Time, want bool, msgAndArgs ...any) {
	t.Helper()
	claimed, err := claimAt(t, st, consumer, key, at)
	require.NoError(t, err, msgAndArgs...)
	require.Equal(t, want, claimed, msgAndArgs...)
}

func partitionedStore(t *testing.T, maxConns int32, cfg store.RetentionConfig) (*store.Store, store.PartitioningResult) {
	t.Helper()
	st := testenv.Migrated(t, maxConns)
	ctx := context.Background()
	_, err := st.Pool().Exec(ctx, "CREATE TABLE ledger (consumer text, message_key text)")
	require.NoError(t, err)
	res, err := st.EnablePartitioning(ctx, cfg)
	require.NoError(t, err)
	return st, res
}

func ledger(t *testing.T, st *store.Store, key string) int64 {
	t.Helper()
	return countIn(t, st, "ledger", "message_key = $1", key)
}

// The reason claimtx partitions by event day and not by processed_at: the
// same message processed on two different days (a redelivery just after
// midnight, a dead-letter replay next week) must meet its claim.
func TestPartitionTwinsAcrossDayBoundary(t *testing.T) {
	t.Parallel()
	st, res := partitionedStore(t, 10, store.RetentionConfig{})
	require.False(t, res.Legacy, "an empty table needs no legacy partition")
	ctx := context.Background()
	today := dbToday(t, st)

	// Produced one tenth of a second before midnight, yesterday.
	event := today.Add(-100 * time.Millisecond)
	requireClaimAt(t, st, "loyalty", "order-completed:9912", event, true)
	// It was processed yesterday...
	_, err := st.Pool().Exec(ctx, "UPDATE "+claimsTable(st)+" SET processed_at = $1", event.Add(50*time.Millisecond))
	require.NoError(t, err)
	// ...and redelivered today, once as-is and once read in another zone.
	for _, at := range []time.Time{event, event.In(time.FixedZone("UTC+5", 5*3600))} {
		requireClaimAt(t, st, "loyalty", "order-completed:9912", at, false, "the redelivery lands in yesterday's partition and conflicts there")
	}
	require.EqualValues(t, 1, ledger(t, st, "order-completed:9912"), "one application")

	var day time.Time
	require.NoError(t, st.Pool().QueryRow(ctx, "SELECT event_day FROM "+claimsTable(st)).Scan(&day))
	require.Equal(t, today.AddDate(0, 0, -1), day.UTC())

	// Another consumer keeps its own claim.
	requireClaimAt(t, st, "analytics", "order-completed:9912", event, true)

	// Concurrent twins: exactly one applies.
	const twins = 8
	var wg sync.WaitGroup
	start := make(chan struct{})
	results := make(chan bool, twins)
	errs := make(chan error, twins)
	for range twins {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			ok, err := claimAt(t, st, "loyalty", "order-completed:7", today.Add(-36*time.Hour))
			results <- ok
			errs <- err
		}()
	}
	close(start)
	wg.Wait()
	close(results)
	close(errs)
	applied := 0
	for ok := range results {
		if ok {
			applied++
		}
	}
	for err := range errs {
		require.NoError(t, err)
	}
	require.Equal(t, 1, applied)
	require.EqualValues(t, 1, ledger(t, st, "order-completed:7"))

	// A plain claim cannot be placed: it has no event day.
	err = pgx.BeginFunc(ctx, st.Pool(), func(tx pgx.Tx) error {
		_, err := claimKey(ctx, st, tx, "loyalty", "k", 0)
		return err
	})
	require.Error(t, err)

	// An event-time claim's wait is bounded as a plain one's.
	holder := begin(t, st)
	ok, err := claimKeyAt(ctx, st, holder, "loyalty", "held", event, 0)
	require.NoError(t, err)
	require.True(t, ok)
	tx := begin(t, st)
	_, err = claimKeyAt(ctx, st, tx, "loyalty", "held", event, 50*time.Millisecond)
	require.Equal(t, pg.ClaimWait, pg.Classify(err))
	_, err = claimKeyAt(ctx, st, nil, "loyalty", "k", event, 0)
	require.Error(t, err)
}

func TestPartitionCreateAheadAndDropExpired(t *testing.T) {
	t.Parallel()
	st, res := partitionedStore(t, 4, store.RetentionConfig{Ahead: 3})
	ctx := context.Background()
	today := dbToday(t, st)

	// An empty table gets one partition per day from the horizon day
	// (today - 30) through today + Ahead.
	require.Len(t, res.Created, 30+1+3)
	parts, err := st.Partitions(ctx)
	require.NoError(t, err)
	require.Len(t, parts, 34)
	require.Equal(t, today.AddDate(0, 0, -30), parts[0].From)
	require.Equal(t, today.AddDate(0, 0, 4), parts[len(parts)-1].To)
	for i, p := range parts {
		require.False(t, p.From.IsZero(), "a day partition, not the legacy one")
		require.Equal(t, p.From.AddDate(0, 0, 1), p.To)
		if i > 0 {
			require.Equal(t, parts[i-1].To, p.From, "contiguous")
		}
	}
	require.Equal(t, st.Config().ClaimsTable+"_p"+today.Format("20060102"), parts[30].Name)

	// Create ahead: only the missing days, idempotently; a dry run only
	// reports.
	created, err := st.CreatePartitionsAhead(ctx, store.RetentionConfig{Ahead: 5, DryRun: true})
	require.NoError(t, err)
	require.Len(t, created, 2)
	created, err = st.CreatePartitionsAhead(ctx, store.RetentionConfig{Ahead: 5})
	require.NoError(t, err)
	require.Len(t, created, 2)
	require.Equal(t, today.AddDate(0, 0, 4), created[0].From)
	require.Equal(t, today.AddDate(0, 0, 5), created[1].From)
	created, err = st.CreatePartitionsAhead(ctx, store.RetentionConfig{Ahead: 5})
	require.NoError(t, err)
	require.Empty(t, created)

	// Claims at several ages.
	for _, age := range []int{20, 12, 5, 0} {
		requireClaimAt(t, st, "c", fmt.Sprintf("age-%d", age), today.AddDate(0, 0, -age).Add(12*time.Hour), true)
	}
	// Beyond the days created ahead: no partition, never applied.
	_, err = claimAt(t, st, "c", "far-future", today.AddDate(0, 0, 30))
	require.ErrorIs(t, err, store.ErrNoPartition)

	// Drop with a 10-day retention: every day before today - 10.
	drop := store.RetentionConfig{Retention: 10 * 24 * time.Hour}
	dropped, err := st.DropExpiredPartitions(ctx, store.RetentionConfig{Retention: drop.Retention, DryRun: true})
	require.NoError(t, err)
	require.Len(t, dropped, 20)
	require.EqualValues(t, 4, countWhere(t, st, "true"), "a dry run drops nothing")
	dropped, err = st.DropExpiredPartitions(ctx, drop)
	require.NoError(t, err)
	require.Len(t, dropped, 20)
	require.Equal(t, today.AddDate(0, 0, -30), dropped[0].From)
	require.Equal(t, today.AddDate(0, 0, -10), dropped[19].To)
	parts, err = st.Partitions(ctx)
	require.NoError(t, err)
	require.Equal(t, today.AddDate(0, 0, -10), parts[0].From)

	require.EqualValues(t, 0, countWhere(t, st, "message_key = 'age-20' OR message_key = 'age-12'"))
	require.EqualValues(t, 2, countWhere(t, st, "message_key = 'age-5' OR message_key = 'age-0'"))
	// A redelivery of a dropped day is refused, not applied again.
	_, err = claimAt(t, st, "c", "age-20", today.AddDate(0, 0, -20).Add(12*time.Hour))
	require.ErrorIs(t, err, store.ErrNoPartition)
	require.EqualValues(t, 1, ledger(t, st, "age-20"))
	requireClaimAt(t, st, "c", "age-5", today.AddDate(0, 0, -5).Add(12*time.Hour), false)

	// Creating with a longer retention never re-creates dropped days.
	created, err = st.CreatePartitionsAhead(ctx, store.RetentionConfig{Ahead: 5})
	require.NoError(t, err)
	require.Empty(t, created)

	// A partition detached by an interrupted run is dropped next time.
	name := parts[0].Name
	_, err = st.Pool().Exec(ctx, "ALTER TABLE "+claimsTable(st)+" DETACH PARTITION "+pgx.Identifier{st.Config().Schema, name}.Sanitize())
	require.NoError(t, err)
	dropped, err = st.DropExpiredPartitions(ctx, store.RetentionConfig{Retention: 9 * 24 * time.Hour})
	require.NoError(t, err)
	require.Len(t, dropped, 1)
	require.Equal(t, name, dropped[0].Name)
	var exists bool
	require.NoError(t, st.Pool().QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", pgx.Identifier{st.Config().Schema, name}.Sanitize()).Scan(&exists))
	require.False(t, exists)

}

func TestPartitionConfigAndStates(t *testing.T) {
	t.Parallel()
	var ce *framework.ConfigError
	for _, tc := range []struct {
		field string
		cfg   store.RetentionConfig
	}{
		{"Retention", store.RetentionConfig{Retention: 24 * time.Hour}},
		{"Retention", store.RetentionConfig{Retention: -1}},
		{"MinRetention", store.RetentionConfig{MinRetention: -1}},
		{"Ahead", store.RetentionConfig{Ahead: -1}},
		{"Ahead", store.RetentionConfig{Ahead: 1000}},
		{"LockWait", store.RetentionConfig{LockWait: -1}},
		{"LockTries", store.RetentionConfig{LockTries: -1}},
	} {
		require.ErrorAs(t, tc.cfg.Validate(), &ce, "%+v", tc.cfg)
		require.Equal(t, tc.field, ce.Field, "%+v", tc.cfg)
	}
	require.NoError(t, store.RetentionConfig{Retention: 2 * 24 * time.Hour, Force: true}.Validate())

	st := testenv.Store(t, 2)
	ctx := context.Background()
	_, err := st.PartitionedForTest(ctx)
	require.ErrorIs(t, err, store.ErrNoClaimTable)
	_, err = st.EnablePartitioning(ctx, store.RetentionConfig{})
	require.ErrorIs(t, err, store.ErrNoClaimTable)
	require.NoError(t, st.Migrate(ctx))
	_, err = st.Partitions(ctx)
	require.ErrorIs(t, err, store.ErrNotPartitioned)
	_, err = st.CreatePartitionsAhead(ctx, store.RetentionConfig{})
	require.ErrorIs(t, err, store.ErrNotPartitioned)
	_, err = st.DropExpiredPartitions(ctx, store.RetentionConfig{})
	require.ErrorIs(t, err, store.ErrNotPartitioned)
	_, err = st.EnablePartitioning(ctx, store.RetentionConfig{Retention: time.Hour})
	require.ErrorAs(t, err, &ce)
	// Shorter than a day is a valid retention for Cleanup, forced, but
	// not for partitions, which drop whole days.
	short := store.RetentionConfig{Retention: 12 * time.Hour, Force: true}
	require.NoError(t, short.Validate())
	_, err = st.EnablePartitioning(ctx, short)
	require.ErrorAs(t, err, &ce)
	require.Equal(t, "Retention", ce.Field)
	require.Contains(t, ce.Reason, "one day")
	require.Equal(t, pg.EventDay(time.Date(2024, 5, 1, 23, 30, 0, 0, time.FixedZone("x", -3600))), time.Date(2024, 5, 2, 0, 0, 0, 0, time.UTC))
}

// Converting a plain claim table that already holds claims: nothing is
// copied, every existing claim keeps deduplicating (even those written
// without an event day), and consumers can move from plain claims to event-time claims
// before the switch.
func TestMigratePlainTableToPartitioned(t *testing.T) {
	t.Parallel()
	st := testenv.Migrated(t, 4)
	ctx := context.Background()
	_, err := st.Pool().Exec(ctx, "CREATE TABLE ledger (consumer text, message_key text)")
	require.NoError(t, err)
	today := dbToday(t, st)
	now := time.Now()

	plainClaim := func(key string) (bool, error) {
		var ok bool
		err := pgx.BeginFunc(ctx, st.Pool(), func(tx pgx.Tx) error {
			var err error
			ok, err = claimKey(ctx, st, tx, "loyalty", key, 0)
			return err
		})
		return ok, err
	}
	ok, err := plainClaim("k-old")
	require.NoError(t, err)
	require.True(t, ok)
	insertAged(t, st, "loyalty", "k-ancient-", 3, "-40 days")

	// Before preparing, an event-time claim says what is missing.
	_, err = claimAt(t, st, "loyalty", "k-x", now)
	require.ErrorContains(t, err, "event_day")

	// Prepared: old and new consumers both work and see each other.
	require.NoError(t, st.PreparePartitioning(ctx, store.RetentionConfig{}))
	require.NoError(t, st.PreparePartitioning(ctx, store.RetentionConfig{}), "idempotent")
	ok, err = plainClaim("k-mid")
	require.NoError(t, err)
	require.True(t, ok)
	requireClaimAt(t, st, "loyalty", "k-mid", now, false)
	requireClaimAt(t, st, "loyalty", "k-new", now, true)
	ok, err = plainClaim("k-new")
	require.NoError(t, err)
	require.False(t, ok)
	partitioned, err := st.PartitionedForTest(ctx)
	require.NoError(t, err)
	require.False(t, partitioned)

	res, err := st.EnablePartitioning(ctx, store.RetentionConfig{Ahead: 3})
	require.NoError(t, err)
	require.False(t, res.AlreadyPartitioned)
	require.True(t, res.Legacy)
	require.Equal(t, today.AddDate(0, 0, 2), res.Boundary)
	require.Len(t, res.Created, 2, "day partitions from the boundary through today + 3")
	partitioned, err = st.PartitionedForTest(ctx)
	require.NoError(t, err)
	require.True(t, partitioned)
	require.EqualValues(t, 6, countWhere(t, st, "true"), "every claim kept, none copied")

	parts, err := st.Partitions(ctx)
	require.NoError(t, err)
	require.Len(t, parts, 3)
	require.Equal(t, st.Config().ClaimsTable+"_legacy", parts[0].Name)
	require.True(t, parts[0].From.IsZero())
	require.Equal(t, res.Boundary, parts[0].To)
	require.Equal(t, res.Boundary, parts[1].From)

	// Redeliveries of messages claimed before the conversion, at any
	// event time before the boundary, are duplicates: k-old's row has no
	// event day, the legacy partition's (consumer, message_key) index
	// catches them.
	for _, at := range []time.Time{now, now.Add(-time.Hour), now.AddDate(0, 0, -3), now.AddDate(0, 0, -45)} {
		requireClaimAt(t, st, "loyalty", "k-old", at, false, "k-old at %s", at)
	}
	requireClaimAt(t, st, "loyalty", "k-ancient-1", now.AddDate(0, 0, -40), false)
	requireClaimAt(t, st, "loyalty", "k-mid", now, false)

	// New messages: before the boundary into the legacy partition, after
	// it into day partitions.
	requireClaimAt(t, st, "loyalty", "k-fresh", now, true)
	requireClaimAt(t, st, "loyalty", "k-future", today.AddDate(0, 0, 2).Add(10*time.Hour), true)
	requireClaimAt(t, st, "loyalty", "k-future", today.AddDate(0, 0, 2).Add(11*time.Hour), false)
	var where string
	require.NoError(t, st.Pool().QueryRow(ctx, "SELECT tableoid::regclass::text FROM "+claimsTable(st)+" WHERE message_key = 'k-future'").Scan(&where))
	require.Contains(t, where, "_p"+today.AddDate(0, 0, 2).Format("20060102"))
	for _, k := range []string{"k-old", "k-mid", "k-new", "k-fresh", "k-future"} {
		require.LessOrEqual(t, ledger(t, st, k), int64(1), k)
	}

	// Old-style consumers fail loudly instead of claiming without a day.
	_, err = plainClaim("k-plain")
	require.Error(t, err)

	// Idempotent; the legacy partition stays until its boundary expires.
	again, err := st.EnablePartitioning(ctx, store.RetentionConfig{Ahead: 3})
	require.NoError(t, err)
	require.True(t, again.AlreadyPartitioned)
	require.Empty(t, again.Created)
	dropped, err := st.DropExpiredPartitions(ctx, store.RetentionConfig{})
	require.NoError(t, err)
	require.Empty(t, dropped)

	stats, err := st.Stats(ctx)
	require.NoError(t, err)
	require.True(t, stats.Partitioned)
	require.Equal(t, 3, stats.Partitions)
	require.EqualValues(t, 8, stats.Claims)
}

// The legacy partition is dropped like any day once its boundary falls
// behind the horizon. Time cannot be moved in a test, so the boundary is
// moved instead: the legacy partition is re-attached with an old one.
func TestLegacyPartitionExpires(t *testing.T) {
	t.Parallel()
	st := testenv.Migrated(t, 4)
	ctx := context.Background()
	insertAged(t, st, "c", "old-", 5, "-50 days")
	res, err := st.EnablePartitioning(ctx, store.RetentionConfig{Ahead: 3})
	require.NoError(t, err)
	require.True(t, res.Legacy)
	legacy := pgx.Identifier{st.Config().Schema, st.Config().ClaimsTable + "_legacy"}.Sanitize()
	_, err = st.Pool().Exec(ctx, fmt.Sprintf(`ALTER TABLE %[1]s DETACH PARTITION %[2]s;
ALTER TABLE %[2]s DROP CONSTRAINT %[3]s;
ALTER TABLE %[1]s ATTACH PARTITION %[2]s FOR VALUES FROM (MINVALUE) TO ((now() - interval '40 days')::date)`,
		claimsTable(st), legacy, pgx.Identifier{st.Config().ClaimsTable + "_legacy_bound"}.Sanitize()))
	require.NoError(t, err)

	dropped, err := st.DropExpiredPartitions(ctx, store.RetentionConfig{})
	require.NoError(t, err)
	require.Len(t, dropped, 1)
	require.True(t, dropped[0].From.IsZero(), "the legacy partition")
	require.EqualValues(t, 0, countWhere(t, st, "true"))
	parts, err := st.Partitions(ctx)
	require.NoError(t, err)
	require.Len(t, parts, 2)
}

// On a claim table partitioned by event day, DropExpiredPartitions deletes
// the memos (which are not partitioned) by time.
func TestDropExpiredPartitionsRemovesExpiredPoisonMemos(t *testing.T) {
	t.Parallel()
	cfg := store.RetentionConfig{Retention: 10 * 24 * time.Hour, Force: true}
	st, _ := partitionedStore(t, 4, cfg)
	ctx := context.Background()
	insertMemos(t, st, "loyalty", "old-", 4, "-11 days")
	insertMemos(t, st, "loyalty", "young-", 2, "-9 days")

	dry := cfg
	dry.DryRun = true
	_, err := st.DropExpiredPartitions(ctx, dry)
	require.NoError(t, err)
	require.EqualValues(t, 6, memoCount(t, st))
	_, err = st.DropExpiredPartitions(ctx, cfg)
	require.NoError(t, err)
	require.EqualValues(t, 2, memoCount(t, st))
}
