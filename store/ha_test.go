//go:build ha

package store_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/internal/testenv"
	"github.com/claimtx/claimtx/store"
)

// Tests in this file run on the .ci/ha cluster (make test-ha): two
// Patroni-managed Postgres nodes. They fail the leader over and leave the
// cluster healthy and asynchronous for the next test. Not parallel.

// haClaim commits one claim and its effect, as the claim middleware does,
// with synchronous_commit set in the transaction when it is not "". It
// returns COMMIT's error: nil is what the broker's ack would follow.
func haClaim(ctx context.Context, st *store.Store, key, synchronousCommit string) error {
	tx, err := st.Pool().Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	if synchronousCommit != "" {
		if _, err := tx.Exec(ctx, "SELECT set_config('synchronous_commit', $1, true)", synchronousCommit); err != nil {
			return err
		}
	}
	res, err := st.Claim(ctx, tx, store.ClaimRequest{Consumer: "ha", Key: key})
	if err != nil {
		return err
	}
	if !res.New {
		return errors.New("claim " + key + " is a duplicate")
	}
	if _, err := tx.Exec(ctx, "INSERT INTO effects(k) VALUES ($1)", key); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// haRows counts key's claim and effect rows on one node.
func haRows(t *testing.T, ha *testenv.HACluster, node, schema, key string) (claims, effects int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, ha.NodeURL(node))
	require.NoError(t, err)
	defer func() { _ = conn.Close(context.Background()) }()
	s := pgx.Identifier{schema}.Sanitize()
	require.NoError(t, conn.QueryRow(ctx,
		"SELECT (SELECT count(*) FROM "+s+".processed_messages WHERE consumer = 'ha' AND message_key = $1), "+
			"(SELECT count(*) FROM "+s+".effects WHERE k = $1)", key).Scan(&claims, &effects))
	return claims, effects
}

// requireRows requires key's claim and effect rows on node to number want.
func requireRows(t *testing.T, ha *testenv.HACluster, node, schema, key string, want [2]int, msgAndArgs ...any) {
	t.Helper()
	claims, effects := haRows(t, ha, node, schema, key)
	require.Equal(t, want, [2]int{claims, effects}, msgAndArgs...)
}

// awaitNewLeader waits for a node other than old, killed at killed, to
// take writes, and logs how long the failover took.
func awaitNewLeader(ctx context.Context, t *testing.T, ha *testenv.HACluster, old string, killed time.Time) string {
	t.Helper()
	leader, err := ha.WaitLeader(ctx, old)
	require.NoError(t, err)
	t.Logf("%s killed, %s takes writes after %v", old, leader, time.Since(killed).Round(time.Millisecond))
	return leader
}

func haStore(t *testing.T) (*testenv.HACluster, *store.Store) {
	t.Helper()
	ha := testenv.HA(t)
	ha.Use(t)
	st := testenv.Migrated(t, 4)
	_, err := st.Pool().Exec(context.Background(), "CREATE TABLE effects(k text PRIMARY KEY)")
	require.NoError(t, err)
	// The replica has the tables before anything is frozen.
	ha.WaitReplicated(t)
	return ha, st
}

// TestHAAsyncFailoverLosesAckedCommit documents the hazard: with
// asynchronous replication (Patroni's default) a claim and its effect
// whose COMMIT succeeded on the leader, so that the broker would have been
// acked, are gone for good after a failover to a replica that had not
// received them. Patroni promotes such a replica because it is within
// maximum_lag_on_failover (1 MB by default). The replica is kept behind by
// stopping the leader's walsender, as a slow network or a busy replica
// would.
func TestHAAsyncFailoverLosesAckedCommit(t *testing.T) {
	ha, st := haStore(t)
	schema := st.Config().Schema
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	require.NoError(t, haClaim(ctx, st, "before", ""))
	ha.WaitReplicated(t)
	ha.FreezeReplication(t)
	require.NoError(t, haClaim(ctx, st, "acked", ""), "the leader commits alone: nothing waits for the replica")

	old := ha.KillLeader(t)
	killed := time.Now()
	leader := awaitNewLeader(ctx, t, ha, old, killed)

	requireRows(t, ha, leader, schema, "before", [2]int{1, 1}, "the claim replicated before the freeze survives")
	requireRows(t, ha, leader, schema, "acked", [2]int{0, 0}, "the acknowledged claim and effect are missing on the new leader")

	// The old leader rejoins as a replica of the new one (pg_rewind): the
	// commit is not coming back from there either.
	ha.WaitHealthy(t)
	ha.WaitReplicated(t)
	requireRows(t, ha, old, schema, "acked", [2]int{0, 0}, "rewound away on the old leader too")
	// A redelivery would now apply it again; but the broker was acked and
	// will not redeliver: the effect is lost.
}

// TestHASyncRemoteApplyLosesNoAckedCommit is the protection: with
// synchronous_mode on and the claim transaction's synchronous_commit =
// remote_apply, COMMIT returns only once the replica has applied it. With
// the replica cut off, COMMIT does not return; the leader is killed under
// it, the client gets an error (no ack: the broker redelivers), and every
// commit that did return is on the new leader.
func TestHASyncRemoteApplyLosesNoAckedCommit(t *testing.T) {
	ha, st := haStore(t)
	schema := st.Config().Schema
	ha.SetSynchronous(t, true)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	require.NoError(t, haClaim(ctx, st, "acked", "remote_apply"))
	ha.FreezeReplication(t)
	committed := make(chan error, 1)
	go func() { committed <- haClaim(ctx, st, "in-flight", "remote_apply") }()
	// Nothing to await but the absence of an event: COMMIT must still be
	// waiting for the replica after a while.
	select {
	case err := <-committed:
		require.Failf(t, "COMMIT returned while the replica received nothing", "err: %v", err)
	case <-time.After(3 * time.Second):
	}

	old := ha.KillLeader(t)
	killed := time.Now()
	select {
	case err := <-committed:
		require.Error(t, err, "the COMMIT that was waiting for the replica must not succeed")
		t.Logf("the waiting COMMIT ended with: %v", err)
	case <-time.After(30 * time.Second):
		require.Fail(t, "the waiting COMMIT did not end when its leader was killed")
	}
	leader := awaitNewLeader(ctx, t, ha, old, killed)

	requireRows(t, ha, leader, schema, "acked", [2]int{1, 1}, "the acknowledged claim and effect are on the new leader")
	requireRows(t, ha, leader, schema, "in-flight", [2]int{0, 0}, "the unacknowledged commit never reached the replica")

	// Its redelivery applies it once, on the new leader.
	require.Eventually(t, func() bool { return haClaim(ctx, st, "in-flight", "") == nil },
		30*time.Second, 100*time.Millisecond, "the redelivered claim commits on the new leader")
	requireRows(t, ha, leader, schema, "in-flight", [2]int{1, 1})
	ha.WaitHealthy(t)
}
