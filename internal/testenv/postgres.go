package testenv

// The Postgres side of the suite: a schema or database per test, on the
// server TEST_DATABASE_URL names.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// DefaultURL is used when TEST_DATABASE_URL is not set.
const DefaultURL = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"

// URL returns TEST_DATABASE_URL, or DefaultURL.
func URL() string {
	if u := os.Getenv("TEST_DATABASE_URL"); u != "" {
		return u
	}
	return DefaultURL
}

// NewSchema creates an empty schema with a random name and drops it (with
// everything in it) when the test ends.
func NewSchema(t testing.TB) string {
	t.Helper()
	schema := randomName("t_")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if BehindPooler() {
		if err := ensureSchemaRole(ctx, schema); err != nil {
			t.Fatalf("testenv: %v", err)
		}
		// Registered first, so it runs after the schema's drop.
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			dropSchemaRole(ctx, t, schema)
		})
	}
	execSQL(ctx, t, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize())
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		execSQL(ctx, t, "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
	})
	return schema
}

// randomName is prefix and 12 random hex digits (crypto/rand never fails).
func randomName(prefix string) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

func execSQL(ctx context.Context, t testing.TB, sql string) {
	t.Helper()
	conn, err := pgx.Connect(ctx, URL())
	if err != nil {
		t.Fatalf("testenv: connect %s: %v", redacted(), err)
	}
	defer func() { _ = conn.Close(ctx) }()
	if _, err := conn.Exec(ctx, sql); err != nil {
		t.Fatalf("testenv: %s: %v", sql, err)
	}
}

// Pool returns a pool whose connections use schema as their search_path, so
// a test's own tables land in its schema, with at most maxConns connections.
// It is closed when the test ends.
func Pool(t testing.TB, schema string, maxConns int32) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(URL())
	if err != nil {
		t.Fatalf("testenv: parse %s: %v", redacted(), err)
	}
	if err := setSearchPath(context.Background(), cfg.ConnConfig, schema); err != nil {
		t.Fatalf("testenv: %v", err)
	}
	if maxConns > 0 {
		cfg.MaxConns = maxConns
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatalf("testenv: pool: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// Setup is NewSchema followed by Pool.
func Setup(t testing.TB, maxConns int32) (*pgxpool.Pool, string) {
	t.Helper()
	schema := NewSchema(t)
	return Pool(t, schema, maxConns), schema
}

// setSearchPath makes cfg's connections use schema as their search_path:
// a startup parameter directly, the schema's own role behind a pooler.
func setSearchPath(ctx context.Context, cfg *pgx.ConnConfig, schema string) error {
	if !BehindPooler() {
		cfg.RuntimeParams["search_path"] = schema
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := ensureSchemaRole(ctx, schema); err != nil {
		return err
	}
	cfg.User = schemaRole(schema)
	return nil
}

func redacted() string {
	cfg, err := pgx.ParseConfig(URL())
	if err != nil {
		return "TEST_DATABASE_URL (unparsable)"
	}
	return cfg.Host + "/" + cfg.Database
}

// URLWithSearchPath returns URL() with search_path set to schema, for
// processes (a consumer under test) that should create their tables there.
func URLWithSearchPath(schema string) (string, error) {
	if BehindPooler() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := ensureSchemaRole(ctx, schema); err != nil {
			return "", err
		}
		return withUser(URL(), schemaRole(schema))
	}
	u, err := url.Parse(URL())
	if err != nil {
		return "", err
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	return u.String(), nil
}

// NewDatabase creates an empty database with a random name and returns its
// URL; the database is dropped (its sessions terminated) when the test
// ends. Start-up tests need it: a fresh schema inside a shared database is
// not the empty database a first deploy meets (claimtx's default schema,
// public's tables and the catalog caches of other sessions differ).
func NewDatabase(t testing.TB) string {
	t.Helper()
	name := randomName("t_db_")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	execSQL(ctx, t, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize())
	t.Cleanup(func() {
		// Generous: a drop cancelled half-way leaves an invalid database
		// behind, and a loaded shared server can take a while to drop one.
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		execSQL(ctx, t, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
	})
	u, err := url.Parse(URL())
	if err != nil {
		t.Fatalf("testenv: parse %s: %v", redacted(), err)
	}
	u.Path = "/" + name
	return u.String()
}

// ExamplePool is for runnable examples, which have no testing.T to fail:
// a pool on the test server whose search_path is a fresh schema of the
// example's own, and that schema's name (Migrate creates it). It panics
// on error; DropExample drops the schema and closes the pool.
func ExamplePool(ctx context.Context) (*pgxpool.Pool, string) {
	schema := randomName("example_")
	cfg, err := pgxpool.ParseConfig(URL())
	if err != nil {
		panic(err)
	}
	if err := setSearchPath(ctx, cfg.ConnConfig, schema); err != nil {
		panic(err)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		panic(err)
	}
	return pool, schema
}

// DropExample drops an ExamplePool schema and closes its pool.
func DropExample(pool *pgxpool.Pool, schema string) {
	_, _ = pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
	pool.Close()
	DropSchemaRole(schema)
}

// DropSchemaRole drops the login role behind a pooler stands for schema's
// search_path (ExamplePool, URLWithSearchPath), once the schema is gone;
// elsewhere there is none and it does nothing. Errors are dropped: a
// leftover role is an empty login, harmless beside an example run.
func DropSchemaRole(schema string) {
	if !BehindPooler() {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if conn, err := pgx.Connect(ctx, URL()); err == nil {
		_ = dropRole(ctx, conn, schemaRole(schema))
		_ = conn.Close(ctx)
	}
}
