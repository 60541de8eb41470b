package store_test

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/claimtx/claimtx/internal/testenv"
	"github.com/claimtx/claimtx/store"
)

// A Store is bound to a schema; Migrate creates its tables (every instance
// may call it at start-up). A claim in your own transaction is new once;
// the same key claimed again finds the committed row, and the effect is
// skipped.
func ExampleNew() {
	ctx := context.Background()
	pool, schema := testenv.ExamplePool(ctx) // pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	defer testenv.DropExample(pool, schema)

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
