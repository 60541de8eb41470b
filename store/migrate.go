package store

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
	"time"

	"github.com/jackc/pgx/v5"
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

// migrations parses the embedded files once. File names are
// NNN_name.up.sql / NNN_name.down.sql, like river's.
var migrations = mustLoadMigrations()

func mustLoadMigrations() []Migration {
	ms, err := loadMigrations(migrationFS)
	if err != nil {
		// The files are compiled in: a bad name is a build-time bug of
		// claimtx itself, caught by every test run, never a user input.
		panic(err)
	}
	return ms
}

func loadMigrations(fsys fs.FS) ([]Migration, error) {
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

// Migrations returns the embedded migrations in order.
func Migrations() []Migration { return append([]Migration(nil), migrations...) }

// LatestVersion is the version Migrate brings a schema to.
func LatestVersion() int { return migrations[len(migrations)-1].Version }

// render substitutes the configured, quoted identifiers into a migration.
func (s *Store) render(sql string) string {
	return s.names.Replace(sql)
}

func (s *Store) migrationLockKey() int64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte("claimtx:migrate:" + s.cfg.Schema)) // hash writes never fail
	return int64(h.Sum64())
}

// Migrate brings the schema to LatestVersion. It is idempotent and safe to
// call from several processes starting at once on an empty database: an
// advisory lock per schema serialises them, and each migration runs in the
// same transaction as its bookkeeping, so a crash leaves either all or none
// of it.
//
// The lock is a session lock taken on a dedicated connection before the
// migrating transaction begins, not a transaction lock inside it. Postgres
// applies other sessions' catalog changes to a backend's caches when a
// transaction starts, not when an advisory lock is granted: a transaction
// that began (or a connection that looked the schema up) before another
// instance committed the schema would still "know" the schema is missing
// after the lock, and its CREATE SCHEMA IF NOT EXISTS would collide
// (duplicate key in pg_namespace_nspname_index). Beginning the transaction
// after the lock makes it see everything its predecessors committed.
func (s *Store) Migrate(ctx context.Context) error {
	// The common case at start-up is "nothing to do". Check it with reads
	// only, in statements of their own before any lock: Postgres checks
	// CREATE privileges before IF NOT EXISTS, so the DDL path would make a
	// least-privilege consumer role (no CREATE) fail to start against an
	// up-to-date schema, and replicas need not queue on the lock to learn
	// it. A failed read just means "migrate".
	if v, err := s.Version(ctx); err == nil && v == LatestVersion() {
		return nil
	}
	return s.underMigrationLock(ctx, func(tx pgx.Tx) error { return s.migrateLocked(ctx, tx) })
}

// MigrateTx is Migrate inside the caller's transaction, for applications
// that run their own migrations in one transaction with claimtx's. It takes
// the advisory lock (a transaction lock) as its first statement; make it
// the first statement of a fresh transaction too. Postgres applies catalog
// changes committed by others only at transaction start, so if several
// processes may migrate an empty database at once, a transaction that
// began before another one's migration committed can fail with a unique
// violation on a catalog index and must be retried in a new transaction;
// Migrate has no such window.
func (s *Store) MigrateTx(ctx context.Context, tx pgx.Tx) error {
	if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", s.migrationLockKey()); err != nil {
		return fmt.Errorf("claimtx: migration lock: %w", err)
	}
	return s.migrateLocked(ctx, tx)
}

// migrateLocked applies the missing migrations in tx; the caller holds the
// migration lock.
func (s *Store) migrateLocked(ctx context.Context, tx pgx.Tx) error {
	// Another instance may have migrated while this one waited for the
	// lock, and MigrateTx has no read path before it: read again, so an
	// up-to-date schema still needs no CREATE privilege.
	v, err := s.versionIn(ctx, tx)
	if err != nil {
		return err
	}
	if v == LatestVersion() {
		return nil
	}
	applied, err := s.ensureAndReadVersions(ctx, tx)
	if err != nil {
		return err
	}
	for _, m := range migrations {
		if applied[m.Version] {
			continue
		}
		if _, err := tx.Exec(ctx, s.render(m.up)); err != nil {
			return fmt.Errorf("claimtx: migration %03d_%s: %w", m.Version, m.Name, err)
		}
		if _, err := tx.Exec(ctx, s.render("INSERT INTO {schema}.claimtx_migration (version, name) VALUES ($1, $2)"), m.Version, m.Name); err != nil {
			return fmt.Errorf("claimtx: record migration %d: %w", m.Version, err)
		}
	}
	return nil
}

// MigrateDown reverts migrations above version target (0 removes every
// claimtx table, and the claims with them: there is no undo).
func (s *Store) MigrateDown(ctx context.Context, target int) error {
	if target < 0 {
		return fmt.Errorf("claimtx: MigrateDown target %d is negative", target)
	}
	return s.underMigrationLock(ctx, func(tx pgx.Tx) error {
		applied, err := s.ensureAndReadVersions(ctx, tx)
		if err != nil {
			return err
		}
		for i := len(migrations) - 1; i >= 0; i-- {
			m := migrations[i]
			if m.Version <= target || !applied[m.Version] {
				continue
			}
			if _, err := tx.Exec(ctx, s.render(m.down)); err != nil {
				return fmt.Errorf("claimtx: migration %03d_%s down: %w", m.Version, m.Name, err)
			}
			if _, err := tx.Exec(ctx, s.render("DELETE FROM {schema}.claimtx_migration WHERE version = $1"), m.Version); err != nil {
				return err
			}
		}
		return nil
	})
}

// Version returns the highest applied migration (0 when none, including
// when the schema does not exist). Health checks compare it with
// LatestVersion.
func (s *Store) Version(ctx context.Context) (int, error) {
	return s.versionIn(ctx, s.pool)
}

func (s *Store) versionIn(ctx context.Context, db querier) (int, error) {
	var exists bool
	if err := db.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", s.render("{schema}.claimtx_migration")).Scan(&exists); err != nil {
		return 0, fmt.Errorf("claimtx: read migration version: %w", err)
	}
	if !exists {
		return 0, nil
	}
	var v int
	if err := db.QueryRow(ctx, s.render("SELECT coalesce(max(version), 0) FROM {schema}.claimtx_migration")).Scan(&v); err != nil {
		return 0, fmt.Errorf("claimtx: read migration version: %w", err)
	}
	return v, nil
}

// underMigrationLock runs fn in a transaction that begins after this
// session holds the migration lock (see Migrate for why the order matters),
// on a connection of its own, and releases the lock after the transaction
// ended.
func (s *Store) underMigrationLock(ctx context.Context, fn func(pgx.Tx) error) error {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("claimtx: migration: acquire connection: %w", err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1)", s.migrationLockKey()); err != nil {
		// A lock wait interrupted by ctx may still have been granted:
		// a connection in that doubt must not go back to the pool.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		_ = conn.Conn().Close(cctx)
		cancel()
		return fmt.Errorf("claimtx: migration lock: %w", err)
	}
	defer func() {
		// ctx may be cancelled (that may be why fn failed); unlocking must
		// still happen.
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if _, err := conn.Exec(uctx, "SELECT pg_advisory_unlock($1)", s.migrationLockKey()); err != nil {
			// Ending the session releases the lock.
			_ = conn.Conn().Close(uctx)
		}
	}()
	return pgx.BeginFunc(ctx, conn, fn)
}

// ensureAndReadVersions creates the schema and the bookkeeping table if
// missing and returns the applied versions. The caller holds the migration
// lock: CREATE … IF NOT EXISTS is not safe against a concurrent create.
func (s *Store) ensureAndReadVersions(ctx context.Context, tx pgx.Tx) (map[int]bool, error) {
	if _, err := tx.Exec(ctx, s.render(`CREATE SCHEMA IF NOT EXISTS {schema};
CREATE TABLE IF NOT EXISTS {schema}.claimtx_migration (
    version    integer     PRIMARY KEY,
    name       text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)`)); err != nil {
		return nil, fmt.Errorf("claimtx: create migration table: %w", err)
	}
	rows, err := tx.Query(ctx, s.render("SELECT version FROM {schema}.claimtx_migration"))
	if err != nil {
		return nil, fmt.Errorf("claimtx: read migrations: %w", err)
	}
	versions, err := pgx.CollectRows(rows, pgx.RowTo[int])
	if err != nil {
		return nil, fmt.Errorf("claimtx: read migrations: %w", err)
	}
	applied := make(map[int]bool, len(versions))
	for _, v := range versions {
		applied[v] = true
	}
	return applied, nil
}
