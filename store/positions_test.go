package store_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/internal/testenv"
	"github.com/claimtx/claimtx/store"
	"github.com/claimtx/claimtx/store/internal/claimsql"
)

func storePositions(t *testing.T, st *store.Store, consumer string, ps ...claimsql.Position) {
	t.Helper()
	ctx := context.Background()
	stmts := claimsql.PositionsFor(st.Config().Schema)
	require.NoError(t, pgx.BeginFunc(ctx, st.Pool(), func(tx pgx.Tx) error {
		return stmts.Store(ctx, tx, consumer, ps)
	}))
}

func loadPositions(t *testing.T, st *store.Store, consumer, topic string, parts ...int32) map[int32]int64 {
	t.Helper()
	stmts := claimsql.PositionsFor(st.Config().Schema)
	stmts.Pool = st.Pool()
	got, err := stmts.Loader(consumer).LoadPositions(context.Background(), topic, parts)
	require.NoError(t, err)
	return got
}

// TestKafkaPositionsOnlyRise: the upsert keeps the greatest position, so a
// transaction that commits late with an older position never lowers it;
// positions are kept per consumer, topic and partition.
func TestKafkaPositionsOnlyRise(t *testing.T) {
	t.Parallel()
	st := testenv.Migrated(t, 4)
	storePositions(t, st, "loyalty", claimsql.Position{Topic: "orders", Partition: 0, SettledBelow: 10})
	storePositions(t, st, "loyalty", claimsql.Position{Topic: "orders", Partition: 0, SettledBelow: 7})
	require.Equal(t, map[int32]int64{0: 10}, loadPositions(t, st, "loyalty", "orders", 0, 1, 2))
	storePositions(t, st, "loyalty",
		claimsql.Position{Topic: "orders", Partition: 2, SettledBelow: 5},
		claimsql.Position{Topic: "orders", Partition: 0, SettledBelow: 12},
		claimsql.Position{Topic: "refunds", Partition: 0, SettledBelow: 3})
	storePositions(t, st, "billing", claimsql.Position{Topic: "orders", Partition: 1, SettledBelow: 99})
	require.Equal(t, map[int32]int64{0: 12, 2: 5}, loadPositions(t, st, "loyalty", "orders", 0, 1, 2))
	require.Equal(t, map[int32]int64{2: 5}, loadPositions(t, st, "loyalty", "orders", 2))
	require.Equal(t, map[int32]int64{0: 3}, loadPositions(t, st, "loyalty", "refunds", 0))
	require.Empty(t, loadPositions(t, st, "loyalty", "nothing", 0))

	// Rolled back: not stored.
	ctx := context.Background()
	tx := begin(t, st)
	require.NoError(t, claimsql.PositionsFor(st.Config().Schema).Store(ctx, tx, "loyalty", []claimsql.Position{{Topic: "orders", Partition: 0, SettledBelow: 50}}))
	require.NoError(t, tx.Rollback(ctx))
	require.Equal(t, map[int32]int64{0: 12}, loadPositions(t, st, "loyalty", "orders", 0))

	s, err := st.Stats(ctx)
	require.NoError(t, err)
	require.Len(t, s.KafkaPositions, 4)
	got := make([]string, len(s.KafkaPositions))
	for i, p := range s.KafkaPositions {
		got[i] = fmt.Sprintf("%s %s/%d %d", p.Consumer, p.Topic, p.Partition, p.SettledBelow)
		require.WithinDuration(t, time.Now(), p.UpdatedAt, time.Minute)
	}
	require.Equal(t, []string{"billing orders/1 99", "loyalty orders/0 12", "loyalty orders/2 5", "loyalty refunds/0 3"}, got)
}

// TestKafkaPositionsWaitForCommit: two transactions raising the same
// partitions (batches of one partition in flight together) queue on the
// rows, in partition order whatever order they name them in, and the
// greater position wins whichever commits last.
func TestKafkaPositionsWaitForCommit(t *testing.T) {
	t.Parallel()
	st := testenv.Migrated(t, 4)
	ctx := context.Background()
	stmts := claimsql.PositionsFor(st.Config().Schema)
	storePositions(t, st, "c", claimsql.Position{Topic: "t", Partition: 0, SettledBelow: 1}, claimsql.Position{Topic: "t", Partition: 1, SettledBelow: 1})
	first := begin(t, st)
	require.NoError(t, stmts.Store(ctx, first, "c", []claimsql.Position{{Topic: "t", Partition: 1, SettledBelow: 20}, {Topic: "t", Partition: 0, SettledBelow: 20}}))
	done := make(chan error, 1)
	go func() {
		done <- pgx.BeginFunc(ctx, st.Pool(), func(tx pgx.Tx) error {
			return stmts.Store(ctx, tx, "c", []claimsql.Position{{Topic: "t", Partition: 0, SettledBelow: 10}, {Topic: "t", Partition: 1, SettledBelow: 30}})
		})
	}()
	select {
	case err := <-done:
		t.Fatalf("the second writer did not wait for the first: %v", err)
	case <-time.After(200 * time.Millisecond):
	}
	require.NoError(t, first.Commit(ctx))
	require.NoError(t, <-done)
	require.Equal(t, map[int32]int64{0: 20, 1: 30}, loadPositions(t, st, "c", "t", 0, 1))
}

// TestRetentionLeavesKafkaPositions: cleanup of the claims (and memos)
// and dropping expired partitions keep the stored positions: they are
// what lets a replay of claims retention removed be skipped.
func TestRetentionLeavesKafkaPositions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	t.Run("cleanup", func(t *testing.T) {
		t.Parallel()
		st := testenv.Migrated(t, 4)
		insertAged(t, st, "loyalty", "old-", 20, "-400 days")
		storePositions(t, st, "loyalty", claimsql.Position{Topic: "orders", Partition: 0, SettledBelow: 20})
		_, err := st.Pool().Exec(ctx, "UPDATE "+pgx.Identifier{st.Config().Schema, "kafka_positions"}.Sanitize()+" SET updated_at = now() - interval '400 days'")
		require.NoError(t, err)
		res, err := st.Cleanup(ctx, store.RetentionConfig{Retention: time.Hour, Force: true, Pause: -1})
		require.NoError(t, err)
		require.EqualValues(t, 20, res.Deleted)
		require.Equal(t, map[int32]int64{0: 20}, loadPositions(t, st, "loyalty", "orders", 0))
	})
	t.Run("partitions", func(t *testing.T) {
		t.Parallel()
		st, _ := partitionedStore(t, 4, store.RetentionConfig{Ahead: 1})
		storePositions(t, st, "c", claimsql.Position{Topic: "orders", Partition: 3, SettledBelow: 7})
		dropped, err := st.DropExpiredPartitions(ctx, store.RetentionConfig{Retention: 24 * time.Hour, Force: true})
		require.NoError(t, err)
		require.NotEmpty(t, dropped)
		require.Equal(t, map[int32]int64{3: 7}, loadPositions(t, st, "c", "orders", 3))
	})
}
