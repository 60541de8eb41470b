package testenv_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/claimtx/claimtx/internal/testenv"
)

// Through a PgBouncer of the test's own, Pool still isolates by schema:
// every transaction, on whichever server connection the pooler picks,
// sees its own schema's tables and not the other test's.
func TestPgBouncerSchemaIsolation(t *testing.T) {
	cfg, err := pgx.ParseConfig(testenv.DefaultURL)
	if err != nil {
		t.Fatal(err)
	}
	url := testenv.StartPgBouncer(t, cfg.Host, int(cfg.Port))
	t.Setenv("TEST_DATABASE_URL", url)
	t.Setenv(testenv.PoolerEnv, "1")
	if !testenv.BehindPooler() {
		t.Fatal("BehindPooler() = false with the variable set")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	poolA, schemaA := testenv.Setup(t, 4)
	poolB, schemaB := testenv.Setup(t, 4)
	if _, err := poolA.Exec(ctx, "CREATE TABLE only_a (i int)"); err != nil {
		t.Fatal(err)
	}
	if _, err := poolB.Exec(ctx, "CREATE TABLE only_b (i int)"); err != nil {
		t.Fatal(err)
	}
	// More transactions than the pooler has server connections per user,
	// from both pools at once, so server connections are reused.
	for i := 0; i < 40; i++ {
		for _, c := range []struct {
			pool interface {
				QueryRow(context.Context, string, ...any) pgx.Row
			}
			schema, mine string
			other        string
		}{{poolA, schemaA, "only_a", "only_b"}, {poolB, schemaB, "only_b", "only_a"}} {
			var sp string
			var mine, other *string
			if err := c.pool.QueryRow(ctx, "SELECT current_schema(), to_regclass($1)::text, to_regclass($2)::text", c.mine, c.other).Scan(&sp, &mine, &other); err != nil {
				t.Fatal(err)
			}
			if sp != c.schema || mine == nil || other != nil {
				t.Fatalf("pool of %s: current_schema %s, %s %v, %s %v: want its own table only", c.schema, sp, c.mine, mine, c.other, other)
			}
		}
	}

	// A process's URL (URLWithSearchPath) lands in the schema too.
	u, err := testenv.URLWithSearchPath(schemaA)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close(ctx) }()
	var sp string
	if err := conn.QueryRow(ctx, "SELECT current_schema()").Scan(&sp); err != nil {
		t.Fatal(err)
	}
	if sp != schemaA {
		t.Fatalf("URLWithSearchPath(%s): current_schema %s", schemaA, sp)
	}
}

func TestPoolerURL(t *testing.T) {
	got := testenv.PoolerURL("postgres://u@h:1/db?sslmode=disable")
	want := "postgres://u@h:1/db?default_query_exec_mode=exec&sslmode=disable"
	if got != want {
		t.Fatalf("PoolerURL = %s, want %s", got, want)
	}
}
