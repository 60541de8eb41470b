package store_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/claimtx/claimtx/internal/testenv"
	"github.com/claimtx/claimtx/store"
)

// A Store is bound to a schema; Migrate creates its tables (every instance
// may call it at start-up). A claim in your own transaction is new once;
// the same key claimed again finds the committed row, and the effect is
// skipped.
func ExampleNew() {
	ctx := context.Background()
	pool, schema := examplePool(ctx) // pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	defer dropSchema(ctx, pool, schema)

	st, err := store.New(pool, store.Config{Schema: schema})
	if err != nil {
		panic(err)
	}
	if err := st.Migrate(ctx); err != nil {
		panic(err)
	}
	if err := st.Migrate(ctx); err != nil { // a second run changes nothing
		panic(err)
	}

	for range 2 {
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			res, err := st.Claim(ctx, tx, store.ClaimRequest{Consumer: "loyalty", Key: "order-completed:9912"})
			if err != nil {
				return err
			}
			fmt.Println("new claim:", res.New)
			// if res.New { apply the effect through tx }
			return nil
		})
		if err != nil {
			panic(err)
		}
	}

	// Names are validated, never spliced into SQL as given.
	_, err = store.New(pool, store.Config{Schema: "Claims; DROP"})
	fmt.Println(err)
	// Output:
	// new claim: true
	// new claim: false
	// claimtx: config field "Schema": "Claims; DROP" must match ^[a-z_][a-z0-9_]{0,62}$
}

// examplePool returns a pool on the test server (TEST_DATABASE_URL, as the
// tests use) and a fresh schema name for the example; Migrate creates the
// schema.
func examplePool(ctx context.Context) (*pgxpool.Pool, string) {
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err)
	}
	pool, err := pgxpool.New(ctx, testenv.URL())
	if err != nil {
		panic(err)
	}
	return pool, "example_" + hex.EncodeToString(b[:])
}

// dropSchema drops the example's schema and closes its pool.
func dropSchema(ctx context.Context, pool *pgxpool.Pool, schema string) {
	_, _ = pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
	pool.Close()
}
