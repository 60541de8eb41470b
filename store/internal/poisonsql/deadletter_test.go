package poisonsql_test

import (
	"context"
	"encoding/base64"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/internal/pg"
	"github.com/claimtx/claimtx/internal/testenv"
	"github.com/claimtx/claimtx/store/internal/migrate"
	"github.com/claimtx/claimtx/store/internal/poisonsql"
)

// TestRecord: a letter is stored as it was given, a missing key as NULL,
// text that Postgres cannot hold (NUL, invalid UTF-8) repaired, headers
// that jsonb cannot hold as strings base64-encoded under a marker, and
// CanRecord says whether the role may insert (not before migration 6).
//
// In every query exec mode of pgx: behind a transaction pooler users set
// exec (or simple_protocol), where a []byte argument is sent as bytea and
// the jsonb column refused it.
func TestRecord(t *testing.T) {
	t.Parallel()
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol, pgx.QueryExecModeDescribeExec} {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			if testenv.BehindPooler() && (mode == pgx.QueryExecModeCacheStatement || mode == pgx.QueryExecModeDescribeExec) {
				// Both keep a prepared statement between round trips that a
				// transaction pooler may send to different server connections.
				t.Skipf("%s does not work behind a transaction pooler", mode)
			}
			testRecord(t, mode)
		})
	}
}

func testRecord(t *testing.T, mode pgx.QueryExecMode) {
	ctx := context.Background()
	schema := testenv.NewSchema(t)
	cfg, err := pgxpool.ParseConfig(testenv.URL())
	require.NoError(t, err)
	cfg.ConnConfig.DefaultQueryExecMode = mode
	cfg.MaxConns = 2
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	n := pg.NewNames(schema, "processed_messages", "outbox")
	ok, err := poisonsql.CanRecord(ctx, pool, n)
	require.NoError(t, err)
	require.False(t, ok, "no table before the migration")
	require.NoError(t, migrate.Up(ctx, pool, n))
	ok, err = poisonsql.CanRecord(ctx, pool, n)
	require.NoError(t, err)
	require.True(t, ok)

	require.NoError(t, poisonsql.Record(ctx, pool, n, poisonsql.Letter{
		Consumer: "loyalty", Topic: "orders", PoisonTopic: "orders.poison", UUID: "u\x00\xff",
		Reason: "bad", Permanent: true, PublishError: "too large",
		Metadata: map[string]string{"event_id": "e1", "bin": "\x00\x01", "k\x00": "v"},
	}))
	var key *string
	var uuid, bin, weird string
	var payload []byte
	require.NoError(t, pool.QueryRow(ctx, `SELECT message_key, uuid, payload, metadata->'bin'->>'base64', metadata->'base64:`+
		base64.StdEncoding.EncodeToString([]byte("k\x00"))+`'->>'base64' FROM `+pgx.Identifier{schema, n.DeadLetter}.Sanitize()).
		Scan(&key, &uuid, &payload, &bin, &weird))
	require.Nil(t, key, "no key: NULL")
	require.Equal(t, "u\uFFFD\uFFFD", uuid)
	require.Empty(t, payload)
	require.Equal(t, base64.StdEncoding.EncodeToString([]byte("\x00\x01")), bin)
	require.Equal(t, base64.StdEncoding.EncodeToString([]byte("v")), weird)
}
