package store_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/internal/testenv"
	"github.com/claimtx/claimtx/store"
)

// proj is the projection of the versioned-upsert tests: a customer's
// current address, with the producer's version of that state.
type proj struct {
	up   *store.VersionedUpsert
	pool *pgxpool.Pool
}

func newProjection(t *testing.T, maxConns int32) proj {
	t.Helper()
	pool, schema := testenv.Setup(t, maxConns)
	_, err := pool.Exec(context.Background(), `CREATE TABLE customer_address (
		customer_id bigint PRIMARY KEY, version bigint NOT NULL, city text NOT NULL, street text NOT NULL)`)
	require.NoError(t, err)
	up, err := store.NewVersionedUpsert(store.VersionedUpsertConfig{
		Schema: schema, Table: "customer_address", Key: []string{"customer_id"}, Columns: []string{"city", "street"},
	})
	require.NoError(t, err)
	return proj{up: up, pool: pool}
}

// deliver applies one event "customer id moved, state version v".
func (p proj) deliver(t *testing.T, id, version int64) bool {
	t.Helper()
	applied, err := p.up.Exec(context.Background(), p.pool, id, version, fmt.Sprintf("city-v%d", version), "street")
	require.NoError(t, err)
	return applied
}

func (p proj) read(t *testing.T, id int64) (int64, string) {
	t.Helper()
	var v int64
	var city string
	require.NoError(t, p.pool.QueryRow(context.Background(), "SELECT version, city FROM customer_address WHERE customer_id = $1", id).Scan(&v, &city))
	return v, city
}

func TestVersionedUpsertOutOfOrder(t *testing.T) {
	t.Parallel()
	p := newProjection(t, 2)
	var applied []bool
	for _, v := range []int64{3, 1, 2, 3, 2} {
		applied = append(applied, p.deliver(t, 1, v))
	}
	require.Equal(t, []bool{true, false, false, false, false}, applied)
	v, city := p.read(t, 1)
	require.Equal(t, int64(3), v)
	require.Equal(t, "city-v3", city)

	// In order, each newer version applies.
	for v := int64(1); v <= 3; v++ {
		require.True(t, p.deliver(t, 2, v))
	}
	require.False(t, p.deliver(t, 2, 3), "a duplicate is harmless and reported as not applied")
	v, city = p.read(t, 2)
	require.Equal(t, int64(3), v)
	require.Equal(t, "city-v3", city)
}

// Deliveries of versions 3,1,2,3,2 for several entities, all at once on
// separate connections, end at version 3 with version 3's state.
func TestVersionedUpsertConcurrent(t *testing.T) {
	t.Parallel()
	p := newProjection(t, 10)
	const entities = 20
	type delivery struct{ id, version int64 }
	var all []delivery
	for id := int64(1); id <= entities; id++ {
		for _, v := range []int64{3, 1, 2, 3, 2} {
			all = append(all, delivery{id, v})
		}
	}
	rand.Shuffle(len(all), func(i, j int) { all[i], all[j] = all[j], all[i] })

	work := make(chan delivery)
	var wg sync.WaitGroup
	var mu sync.Mutex
	appliedV3 := map[int64]int{}
	errs := make(chan error, len(all))
	for w := 0; w < 10; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for d := range work {
				applied, err := p.up.Exec(context.Background(), p.pool, d.id, d.version, fmt.Sprintf("city-v%d", d.version), "street")
				errs <- err
				if applied && d.version == 3 {
					mu.Lock()
					appliedV3[d.id]++
					mu.Unlock()
				}
			}
		}()
	}
	for _, d := range all {
		work <- d
	}
	close(work)
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	for id := int64(1); id <= entities; id++ {
		v, city := p.read(t, id)
		require.Equal(t, int64(3), v, "entity %d", id)
		require.Equal(t, "city-v3", city, "entity %d", id)
		require.Equal(t, 1, appliedV3[id], "version 3 of entity %d applied exactly once", id)
	}
}

func TestVersionedUpsertConfig(t *testing.T) {
	t.Parallel()
	up, err := store.NewVersionedUpsert(store.VersionedUpsertConfig{Table: "t", Key: []string{"a", "b"}, Version: "seq", Columns: []string{"c"}})
	require.NoError(t, err)
	require.Equal(t, `INSERT INTO "t" AS t ("a", "b", "seq", "c") VALUES ($1, $2, $3, $4) ON CONFLICT ("a", "b") DO UPDATE SET "seq" = EXCLUDED."seq", "c" = EXCLUDED."c" WHERE t."seq" < EXCLUDED."seq"`, up.SQLForTest())
	_, err = up.Exec(context.Background(), nil, 1, 2, 3, 4)
	require.Error(t, err)

	for _, tc := range []struct {
		field string
		cfg   store.VersionedUpsertConfig
	}{
		{"Table", store.VersionedUpsertConfig{Key: []string{"id"}}},
		{"Table", store.VersionedUpsertConfig{Table: `t"; DROP TABLE x; --`, Key: []string{"id"}}},
		{"Schema", store.VersionedUpsertConfig{Schema: "Public", Table: "t", Key: []string{"id"}}},
		{"Key", store.VersionedUpsertConfig{Table: "t"}},
		{"Key", store.VersionedUpsertConfig{Table: "t", Key: []string{"id", "id"}}},
		{"Key", store.VersionedUpsertConfig{Table: "t", Key: []string{"ID"}}},
		{"Version", store.VersionedUpsertConfig{Table: "t", Key: []string{"version"}}},
		{"Columns", store.VersionedUpsertConfig{Table: "t", Key: []string{"id"}, Columns: []string{"x y"}}},
		{"Columns", store.VersionedUpsertConfig{Table: "t", Key: []string{"id"}, Columns: []string{"version"}}},
	} {
		_, err := store.NewVersionedUpsert(tc.cfg)
		var ce *framework.ConfigError
		require.ErrorAs(t, err, &ce, "%+v", tc.cfg)
		require.Equal(t, tc.field, ce.Field, "%+v", tc.cfg)
	}
}

func TestVersionedUpsertArgCount(t *testing.T) {
	t.Parallel()
	p := newProjection(t, 1)
	_, err := p.up.Exec(context.Background(), p.pool, int64(1), int64(1))
	require.Error(t, err)
	require.True(t, framework.IsPermanent(err))
}

func ExampleNewVersionedUpsert() {
	// A projection customer_address(customer_id PRIMARY KEY, version,
	// city). The upsert's statement is
	//
	//	INSERT INTO "customer_address" AS t ("customer_id", "version", "city") VALUES ($1, $2, $3)
	//	ON CONFLICT ("customer_id") DO UPDATE SET "version" = EXCLUDED."version", "city" = EXCLUDED."city"
	//	WHERE t."version" < EXCLUDED."version"
	up, err := store.NewVersionedUpsert(store.VersionedUpsertConfig{
		Table: "customer_address", Key: []string{"customer_id"}, Columns: []string{"city"},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	// A handler runs it in the message's transaction, values in
	// configuration order (key, version, columns):
	//
	//	applied, err := up.Exec(ctx, tx, customerID, version, city)
	fmt.Println("built:", up != nil)

	// Names are checked, never spliced into SQL as given.
	_, err = store.NewVersionedUpsert(store.VersionedUpsertConfig{Table: "Customer", Key: []string{"id"}})
	fmt.Println(err)
	// Output:
	// built: true
	// claimtx: config field "Table": "Customer" must match ^[a-z_][a-z0-9_]{0,62}$
}
