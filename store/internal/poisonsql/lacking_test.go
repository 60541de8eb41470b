package poisonsql_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/internal/pg"
	"github.com/claimtx/claimtx/internal/testenv"
	"github.com/claimtx/claimtx/store/internal/poisonsql"
)

// TestLacking: one query says whether the table exists and which
// privileges a role lacks on it, in the order asked.
func TestLacking(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := testenv.Setup(t, 2)
	table := pg.Ident(schema, "t")
	exists, lacking, err := poisonsql.Lacking(ctx, pool, table, "SELECT", "INSERT")
	require.NoError(t, err)
	require.False(t, exists)
	require.Empty(t, lacking)

	_, err = pool.Exec(ctx, "CREATE TABLE "+table+" (k text)")
	require.NoError(t, err)
	role := schema + "_reader"
	_, err = pool.Exec(ctx, fmt.Sprintf("CREATE ROLE %[1]s; GRANT USAGE ON SCHEMA %[2]s TO %[1]s; GRANT SELECT ON %[3]s TO %[1]s", pg.Ident(role), pg.Ident(schema), table))
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), "DROP OWNED BY "+pg.Ident(role)+"; DROP ROLE "+pg.Ident(role))
	})

	exists, lacking, err = poisonsql.Lacking(ctx, pool, table, "UPDATE", "SELECT", "INSERT")
	require.NoError(t, err)
	require.True(t, exists)
	require.Empty(t, lacking, "the owner lacks nothing")

	tx := testenv.Begin(t, pool)
	_, err = tx.Exec(ctx, "SET LOCAL ROLE "+pg.Ident(role))
	require.NoError(t, err)
	exists, lacking, err = poisonsql.Lacking(ctx, tx, table, "UPDATE", "SELECT", "INSERT")
	require.NoError(t, err)
	require.True(t, exists)
	require.Equal(t, []string{"UPDATE", "INSERT"}, lacking)
}
