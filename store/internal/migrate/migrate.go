// Package migrate holds claimtx's schema migrations and runs them: up for
// Store.Migrate and Store.MigrateTx, down for this repository's tests and
// tools. Migrations are embedded (migrations/NNN_name.up.sql / .down.sql),
// recorded in <schema>.claimtx_migration and run under an advisory lock
// per schema.
package migrate

import (
	"context"
	"embed"
	"fmt"
	"hash/fnv"
	"io/fs"
	"path"
	"sort"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/claimtx/claimtx/internal/pg"
)

//go:embed migrations/*.sql
var migrationFS embed.FS

// Migration is one embedded, numbered schema change.
type Migration struct {
	Version int
	Name    string
	up      string
	down    string
}

// migrations are compiled in: a bad name is a bug every test run catches.
var migrations = mustLoad()

func mustLoad() []Migration {
	ms, err := Load(migrationFS)
	if err != nil {
		panic(err)
	}
	return ms
}

// Load parses the migrations under fsys's "migrations" directory and
// checks their names: versions 1..n without gaps, one name per version,
// an up file for each.
func Load(fsys fs.FS) ([]Migration, error) {
	entries, err := fs.ReadDir(fsys, "migrations")
	if err != nil {
		return nil, err
	}
	byVersion := map[int]*Migration{}
	for _, e := range entries {
		name := e.Name()
		base, dir, ok := strings.Cut(strings.TrimSuffix(name, ".sql"), ".")
		if !ok || (dir != "up" && dir != "down") {
			return nil, fmt.Errorf("migration %q: want NNN_name.up.sql or NNN_name.down.sql", name)
		}
		num, label, _ := strings.Cut(base, "_")
		v, err := strconv.Atoi(num)
		if err != nil || v <= 0 {
			return nil, fmt.Errorf("migration %q: bad version", name)
		}
		body, err := fs.ReadFile(fsys, path.Join("migrations", name))
		if err != nil {
			return nil, err
		}
		m := byVersion[v]
		if m == nil {
			m = &Migration{Version: v, Name: label}
			byVersion[v] = m
		}
		if m.Name != label {
			return nil, fmt.Errorf("migration version %d is used by both %q and %q", v, m.Name, label)
		}
		if dir == "up" {
			m.up = string(body)
		} else {
			m.down = string(body)
		}
	}
	out := make([]Migration, 0, len(byVersion))
	for _, m := range byVersion {
		if m.up == "" {
			return nil, fmt.Errorf("migration %d has no up file", m.Version)
		}
		out = append(out, *m)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	for i, m := range out {
		if m.Version != i+1 {
			return nil, fmt.Errorf("migration versions must be 1..n without gaps, found %d at position %d", m.Version, i+1)
		}
	}
	return out, nil
}

// Latest is the version Up brings a schema to.
func Latest() int { return migrations[len(migrations)-1].Version }

// LockKey is the advisory lock key that serialises migrations of schema.
func LockKey(schema string) int64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte("claimtx:migrate:" + schema)) // hash writes never fail
	return int64(h.Sum64())
}

// Up brings the schema to Latest; see Store.Migrate. It keeps no session
// state, so it works through a transaction pooler: one transaction takes
// the migration lock (a transaction lock) and migrates.
func Up(ctx context.Context, pool *pgxpool.Pool, n *pg.Names) error {
	// "Nothing to do" is checked with reads only, before any lock:
	// Postgres checks CREATE privileges before IF NOT EXISTS, so the DDL
	// path would fail a role without CREATE against an up-to-date schema.
	// A failed read just means "migrate".
	if v, err := Version(ctx, pool, n); err == nil && v == Latest() {
		return nil
	}
	return underLock(ctx, pool, n, func(tx pgx.Tx) error { return upLocked(ctx, tx, n) })
}

// UpTx is Up inside the caller's transaction (see Store.MigrateTx): a
// failure of stale caches (see underLock) is the caller's to retry.
func UpTx(ctx context.Context, tx pgx.Tx, n *pg.Names) error {
	if err := lockXact(ctx, tx, n); err != nil {
		return err
	}
	return upLocked(ctx, tx, n)
}

// upLocked applies the missing migrations in tx; the caller holds the
// migration lock.
func upLocked(ctx context.Context, tx pgx.Tx, n *pg.Names) error {
	// Another instance may have migrated while this one waited for the
	// lock (and UpTx has no read path before it): read again.
	v, err := Version(ctx, tx, n)
	if err != nil {
		return err
	}
	if v == Latest() {
		return nil
	}
	applied, err := ensureAndReadVersions(ctx, tx, n)
	if err != nil {
		return err
	}
	for _, m := range migrations {
		if applied[m.Version] {
			continue
		}
		if _, err := tx.Exec(ctx, n.Render(m.up)); err != nil {
			return fmt.Errorf("claimtx: migration %03d_%s: %w", m.Version, m.Name, err)
		}
		if _, err := tx.Exec(ctx, n.Render("INSERT INTO {schema}.claimtx_migration (version, name) VALUES ($1, $2)"), m.Version, m.Name); err != nil {
			return fmt.Errorf("claimtx: record migration %d: %w", m.Version, err)
		}
	}
	return nil
}

// Down reverts migrations above version target (0 removes every claimtx
// table, and the claims with them: there is no undo), under the same lock
// as Up.
func Down(ctx context.Context, pool *pgxpool.Pool, n *pg.Names, target int) error {
	if target < 0 {
		return fmt.Errorf("claimtx: migrate down: target %d is negative", target)
	}
	return underLock(ctx, pool, n, func(tx pgx.Tx) error {
		applied, err := ensureAndReadVersions(ctx, tx, n)
		if err != nil {
			return err
		}
		for i := len(migrations) - 1; i >= 0; i-- {
			m := migrations[i]
			if m.Version <= target || !applied[m.Version] {
				continue
			}
			if _, err := tx.Exec(ctx, n.Render(m.down)); err != nil {
				return fmt.Errorf("claimtx: migration %03d_%s down: %w", m.Version, m.Name, err)
			}
			if _, err := tx.Exec(ctx, n.Render("DELETE FROM {schema}.claimtx_migration WHERE version = $1"), m.Version); err != nil {
				return err
			}
		}
		return nil
	})
}

// Version returns the highest applied migration (0 when none, including
// when the schema does not exist).
func Version(ctx context.Context, db pg.Querier, n *pg.Names) (int, error) {
	var exists bool
	if err := db.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", n.Render("{schema}.claimtx_migration")).Scan(&exists); err != nil {
		return 0, fmt.Errorf("claimtx: read migration version: %w", err)
	}
	if !exists {
		return 0, nil
	}
	var v int
	err := db.QueryRow(ctx, n.Render("SELECT coalesce(max(version), 0) FROM {schema}.claimtx_migration")).Scan(&v)
	return v, pg.Wrap(err, "claimtx: read migration version")
}

// underLock runs fn in a transaction that first takes the migration lock.
// Catalog caches are not refreshed when an advisory lock is granted, so a
// backend that cached "no such schema" before its predecessor committed
// could collide on CREATE SCHEMA IF NOT EXISTS (not seen on Postgres 15,
// TestUpAfterPredecessorCreatedSchema): then a new transaction is tried.
func underLock(ctx context.Context, pool *pgxpool.Pool, n *pg.Names, fn func(pgx.Tx) error) error {
	run := func() error {
		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if err := lockXact(ctx, tx, n); err != nil {
				return err
			}
			return fn(tx)
		})
	}
	err := run()
	for attempt := 1; attempt < staleCacheAttempts && staleCatalog(err); attempt++ {
		err = run()
	}
	return err
}

// staleCacheAttempts: the second try sees its predecessor's schema; a
// third covers a newer claimtx migrating further meanwhile.
const staleCacheAttempts = 3

// lockXact takes the migration lock for the rest of tx.
func lockXact(ctx context.Context, tx pgx.Tx, n *pg.Names) error {
	_, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", LockKey(n.Schema))
	return pg.Wrap(err, "claimtx: migration lock")
}

// staleCatalog reports whether err is what a stale catalog cache makes a
// CREATE … IF NOT EXISTS do: a unique violation in a catalog index, or a
// duplicate schema or table.
func staleCatalog(err error) bool {
	switch pg.SQLState(err) {
	case "23505", "42P06", "42P07":
		return true
	}
	return false
}

// ensureAndReadVersions creates the schema and the bookkeeping table if
// missing and returns the applied versions, under the migration lock
// (CREATE … IF NOT EXISTS is not safe against a concurrent create).
func ensureAndReadVersions(ctx context.Context, tx pgx.Tx, n *pg.Names) (map[int]bool, error) {
	if _, err := tx.Exec(ctx, n.Render(`CREATE SCHEMA IF NOT EXISTS {schema};
CREATE TABLE IF NOT EXISTS {schema}.claimtx_migration (
    version    integer     PRIMARY KEY,
    name       text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)`)); err != nil {
		return nil, fmt.Errorf("claimtx: create migration table: %w", err)
	}
	applied := map[int]bool{}
	rows, err := tx.Query(ctx, n.Render("SELECT version FROM {schema}.claimtx_migration"))
	if err == nil {
		var v int
		_, err = pgx.ForEachRow(rows, []any{&v}, func() error {
			applied[v] = true
			return nil
		})
	}
	if err != nil {
		return nil, fmt.Errorf("claimtx: read migrations: %w", err)
	}
	return applied, nil
}
