package main

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/store"
)

// pgRoles creates LOGIN roles with unique names for one test and drops them
// (with their grants in this database) when it ends. Trust authentication
// on 127.0.0.1 lets any role log in without a password.
func pgRoles(t *testing.T, pool *pgxpool.Pool, prefixes ...string) []string {
	t.Helper()
	ctx := context.Background()
	names := make([]string, len(prefixes))
	for i, p := range prefixes {
		names[i] = p + "_" + randID()
		_, err := pool.Exec(ctx, "CREATE ROLE "+pgx.Identifier{names[i]}.Sanitize()+" LOGIN")
		require.NoError(t, err)
	}
	t.Cleanup(func() {
		for _, n := range names {
			id := pgx.Identifier{n}.Sanitize()
			if _, err := pool.Exec(context.Background(), "DROP OWNED BY "+id+"; DROP ROLE "+id); err != nil {
				t.Errorf("drop role %s: %v", n, err)
			}
		}
	})
	return names
}

// asRole returns dbURL logging in as role.
func asRole(t *testing.T, dbURL, role string) string {
	t.Helper()
	u, err := url.Parse(dbURL)
	require.NoError(t, err)
	u.User = url.User(role)
	return u.String()
}

func rolePool(t *testing.T, dbURL string) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), dbURL)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// requireDenied requires each of stmts, its %s the quoted schema, to
// fail on pool for want of a privilege.
func requireDenied(t *testing.T, pool *pgxpool.Pool, schema string, stmts ...string) {
	t.Helper()
	for _, stmt := range stmts {
		sql := fmt.Sprintf(stmt, schema)
		_, err := pool.Exec(context.Background(), sql)
		var pgErr *pgconn.PgError
		require.True(t, errors.As(err, &pgErr), "%s: want a permission error, got %v", sql, err)
		require.Equal(t, "42501", pgErr.Code, "%s: %v", sql, err) // insufficient_privilege
	}
}

// ownedWorld is what the owner (here: postgres) prepares before the
// least-privilege tests log in: claimtx's tables migrated, the effect
// tables created, and a consumer and a cleanup role, which the test grants
// to.
type ownedWorld struct {
	consumerRole, cleanupRole string // quoted, for GRANT statements
	consumerURL, cleanupURL   string // h.dbURL logging in as each role
}

func newOwnedWorld(t *testing.T, h *harness) ownedWorld {
	t.Helper()
	ctx := context.Background()
	st, err := store.New(h.pool, store.Config{Schema: h.schema})
	require.NoError(t, err)
	require.NoError(t, st.Migrate(ctx))
	require.NoError(t, createTables(ctx, h.pool))
	roles := pgRoles(t, h.pool, "claimtx_consumer", "claimtx_cleanup")
	return ownedWorld{
		consumerRole: pgx.Identifier{roles[0]}.Sanitize(), cleanupRole: pgx.Identifier{roles[1]}.Sanitize(),
		consumerURL: asRole(t, h.dbURL, roles[0]), cleanupURL: asRole(t, h.dbURL, roles[1]),
	}
}

// TestLeastPrivilegeRoles runs the loyalty consumer under a role that can
// only read and insert claims and write its effect tables, and claim
// retention under a separate role that can only read and delete claims, as
// docs/security.md prescribes. Migrations run first as the owner.
func TestLeastPrivilegeRoles(t *testing.T) {
	t.Parallel()
	h := newHarness(t, "amqp")
	ctx := context.Background()
	schema := pgx.Identifier{h.schema}.Sanitize()

	w := newOwnedWorld(t, h)
	consumerRole, cleanupRole, consumerURL, cleanupURL := w.consumerRole, w.cleanupRole, w.consumerURL, w.cleanupURL
	grants := fmt.Sprintf(`
GRANT USAGE ON SCHEMA %[1]s TO %[2]s, %[3]s;
GRANT SELECT, INSERT ON %[1]s.processed_messages TO %[2]s;
GRANT SELECT ON %[1]s.claimtx_migration TO %[2]s;
GRANT INSERT ON %[1]s.processed_messages_dead_letter TO %[2]s;
GRANT SELECT, INSERT, UPDATE ON %[1]s.balances, %[1]s.point_ledger TO %[2]s;
GRANT SELECT, DELETE ON %[1]s.processed_messages TO %[3]s;
GRANT SELECT, INSERT, UPDATE, DELETE ON %[1]s.claimtx_lease TO %[3]s;`, schema, consumerRole, cleanupRole)
	_, err := h.pool.Exec(ctx, grants)
	require.NoError(t, err)
	consumerPool, cleanupPool := rolePool(t, consumerURL), rolePool(t, cleanupURL)

	// With exactly these grants the consumer starts: start-up reads the
	// migration version and the effect tables' existence first and runs
	// no DDL when everything is in place (Postgres would check CREATE
	// before IF NOT EXISTS).
	cst, err := store.New(consumerPool, store.Config{Schema: h.schema})
	require.NoError(t, err)
	require.NoError(t, cst.Migrate(ctx), "up to date: no DDL, no CREATE needed")
	require.NoError(t, createTables(ctx, consumerPool))

	// The consumer works under its role: every order once, duplicates too.
	p := h.start("DATABASE_URL=" + consumerURL)
	ords := orders(1, 50)
	h.publish(ords...)
	h.publish(ords[:20]...)
	h.waitApplied(len(ords))
	h.waitFor("claims", func() bool {
		return h.tryCount(fmt.Sprintf("SELECT count(*) FROM %s.processed_messages", schema)) == len(ords)
	})
	h.assertExact(ords)
	// Every copy settled before retention runs below: a copy still in
	// flight when its claim is deleted would be applied again, which is
	// what retention shorter than the redelivery window means.
	var got map[string]int
	h.waitFor("every delivery settled", func() bool {
		got = p.outcomes(t)
		return got["applied"]+got["duplicate"] >= len(ords)+20
	})
	require.Equal(t, map[string]int{"applied": len(ords), "duplicate": 20, "expired": 0, "failed": 0, "parked": 0, "poisoned": 0}, got)

	// What the consumer role must not do to claims (or to effects).
	requireDenied(t, consumerPool, schema,
		"DELETE FROM %s.processed_messages",
		"UPDATE %s.processed_messages SET message_key = 'x'",
		"TRUNCATE %s.processed_messages",
		"DROP TABLE %s.processed_messages",
		"ALTER TABLE %s.processed_messages DROP CONSTRAINT processed_messages_pkey",
		"DELETE FROM %s.point_ledger",
		"DELETE FROM %s.claimtx_migration",
	)
	require.Equal(t, len(ords), h.count(fmt.Sprintf("SELECT count(*) FROM %s.processed_messages", schema)), "claims intact")

	// The cleanup role runs retention: it deletes claims, and nothing else.
	clean, err := store.New(cleanupPool, store.Config{Schema: h.schema})
	require.NoError(t, err)
	res, err := clean.Cleanup(ctx, store.RetentionConfig{Retention: time.Millisecond, Force: true, Pause: -1})
	require.NoError(t, err)
	require.EqualValues(t, len(ords), res.Deleted)
	require.Zero(t, h.count(fmt.Sprintf("SELECT count(*) FROM %s.processed_messages", schema)))
	requireDenied(t, cleanupPool, schema,
		"INSERT INTO %s.processed_messages (consumer, message_key) VALUES ('loyalty', 'forged')",
		"SELECT * FROM %s.balances",
		"UPDATE %s.balances SET points = 0",
		"DELETE FROM %s.point_ledger",
		"CREATE TABLE %s.x (i int)",
	)
	require.Equal(t, len(ords), h.count("SELECT count(*) FROM point_ledger"), "effects intact")
}
