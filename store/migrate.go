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
// call from several instances starting at once: a transaction-scoped
// advisory lock per schema serialises them, and each migration runs in the
// same transaction as its bookkeeping, so a crash leaves either all or none
// of it.
func (s *Store) Migrate(ctx context.Context) error {
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error { return s.MigrateTx(ctx, tx) })
}

// MigrateTx is Migrate inside the caller's transaction, for applications
// that run their own migrations in one transaction with claimtx's.
func (s *Store) MigrateTx(ctx context.Context, tx pgx.Tx) error {
	// The common case at start-up is "nothing to do". Check it with reads
	// only: Postgres checks CREATE privileges before IF NOT EXISTS, so the
	// DDL path would make a least-privilege consumer role (no CREATE) fail
	// to start against an up-to-date schema.
	if v, err := s.versionIn(ctx, tx); err == nil && v == LatestVersion() {
		return nil
	}
	applied, err := s.lockAndReadVersions(ctx, tx)
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
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		applied, err := s.lockAndReadVersions(ctx, tx)
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

func (s *Store) lockAndReadVersions(ctx context.Context, tx pgx.Tx) (map[int]bool, error) {
	if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", s.migrationLockKey()); err != nil {
		return nil, fmt.Errorf("claimtx: migration lock: %w", err)
	}
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
