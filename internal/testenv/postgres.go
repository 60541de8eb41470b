package testenv

// The Postgres side of the suite: a schema or database per test, on the
// server TEST_DATABASE_URL names.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
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
	if BehindPooler() {
		if err := ensureSchemaRole(context.Background(), schema); err != nil {
			t.Fatalf("testenv: %v", err)
		}
		// Registered first, so it runs after the schema's drop; a role left
		// behind (owning something in a database of the test's own) is an
		// empty login: logged, not failed.
		t.Cleanup(func() {
			if err := dropSchemaRole(schema); err != nil {
				t.Logf("testenv: drop role %s: %v", schema, err)
			}
		})
	}
	ident := pgx.Identifier{schema}.Sanitize()
	createDropped(t, "CREATE SCHEMA "+ident, "DROP SCHEMA IF EXISTS "+ident+" CASCADE", 30*time.Second)
	return schema
}

// createDropped runs create, and drop (given dropTimeout) when the test ends.
func createDropped(t testing.TB, create, drop string, dropTimeout time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	execSQL(ctx, t, create)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), dropTimeout)
		defer cancel()
		execSQL(ctx, t, drop)
	})
}

// randomName is prefix and 12 random hex digits (crypto/rand never fails).
func randomName(prefix string) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

func execSQL(ctx context.Context, t testing.TB, sql string) {
	t.Helper()
	if err := onServer(ctx, func(conn *pgx.Conn) error { _, err := conn.Exec(ctx, sql); return err }); err != nil {
		t.Fatalf("testenv: %s: %v", sql, err)
	}
}

// onServer runs f on a connection of its own to URL().
func onServer(ctx context.Context, f func(*pgx.Conn) error) error {
	conn, err := pgx.Connect(ctx, URL())
	if err != nil {
		return fmt.Errorf("connect %s: %w", redacted(), err)
	}
	defer func() { _ = conn.Close(ctx) }()
	return f(conn)
}

// Pool returns a pool whose connections use schema as their search_path, so
// a test's own tables land in its schema, with at most maxConns connections.
// It is closed when the test ends.
func Pool(t testing.TB, schema string, maxConns int32) *pgxpool.Pool {
	t.Helper()
	pool, err := newPool(context.Background(), schema, maxConns)
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// newPool is Pool without a test (maxConns 0: pgxpool's default): its
// connections use schema as their search_path, a startup parameter
// directly, the schema's own role behind a pooler.
func newPool(ctx context.Context, schema string, maxConns int32) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(URL())
	if err != nil {
		return nil, fmt.Errorf("parse %s: %w", redacted(), err)
	}
	if BehindPooler() {
		if err := ensureSchemaRole(ctx, schema); err != nil {
			return nil, err
		}
		cfg.ConnConfig.User = schemaRole(schema)
	} else {
		cfg.ConnConfig.RuntimeParams["search_path"] = schema
	}
	if maxConns > 0 {
		cfg.MaxConns = maxConns
	}
	return pgxpool.NewWithConfig(ctx, cfg)
}

// Setup is NewSchema followed by Pool.
func Setup(t testing.TB, maxConns int32) (*pgxpool.Pool, string) {
	t.Helper()
	schema := NewSchema(t)
	return Pool(t, schema, maxConns), schema
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
	if !BehindPooler() {
		return withParam(URL(), "search_path", schema)
	}
	u, err := url.Parse(URL())
	if err != nil {
		return "", err
	}
	if err := ensureSchemaRole(context.Background(), schema); err != nil {
		return "", err
	}
	if p, ok := u.User.Password(); ok {
		u.User = url.UserPassword(schemaRole(schema), p)
	} else {
		u.User = url.User(schemaRole(schema))
	}
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
	ident := pgx.Identifier{name}.Sanitize()
	// A generous drop: one cancelled half-way leaves an invalid database
	// behind, and a loaded shared server can take a while to drop one.
	createDropped(t, "CREATE DATABASE "+ident, "DROP DATABASE IF EXISTS "+ident+" WITH (FORCE)", 2*time.Minute)
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
	pool, err := newPool(ctx, schema, 0)
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
	if BehindPooler() {
		_ = dropSchemaRole(schema)
	}
}
