package claimtxcli

import (
	"context"
	"net/url"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/internal/testenv"
	"github.com/claimtx/claimtx/store"
)

// The operator's commands work through a PgBouncer in transaction mode
// with the URL an operator copies from elsewhere, without
// default_query_exec_mode: the CLI does not use pgx's statement cache
// unless the URL asks for it. Cleanup and partition maintenance take the
// retention lease through the pooler.
func TestCLIBehindTransactionPooler(t *testing.T) {
	t.Parallel()
	direct, err := pgx.ParseConfig(testenv.DirectURL())
	require.NoError(t, err)
	u, err := url.Parse(testenv.StartPgBouncer(t, direct.Host, int(direct.Port)))
	require.NoError(t, err)
	q := u.Query()
	q.Del("default_query_exec_mode")
	u.RawQuery = q.Encode()
	bouncer := u.String()

	c := newCLI(t)
	c.env["DATABASE_URL"] = bouncer
	require.Contains(t, c.ok("migrate"), "to version")
	table := pgx.Identifier{c.schema, "processed_messages"}.Sanitize()
	c.exec(`INSERT INTO ` + table + ` (consumer, message_key, processed_at)
SELECT 'loyalty', 'k' || g, now() - (g || ' days')::interval FROM generate_series(1, 40) g`)
	// Enough statements that most land on another server connection than
	// the one before.
	for range 3 {
		require.Contains(t, c.ok("stats"), "total 40 claims")
	}
	require.Contains(t, c.ok("cleanup", "--dry-run"), "dry run: 11 claims")
	out := c.ok("cleanup", "--batch-size", "2", "--min-batch-size", "2", "--max-batch-size", "2", "--pause", "-1ns", "--progress", "log", "--vacuum")
	require.Contains(t, out, "cleanup: 11 claims processed before")
	require.Contains(t, out, "then vacuumed")
	require.Contains(t, c.ok("stats"), "total 29 claims")

	st := c.store()
	ctx := context.Background()
	require.NoError(t, pgx.BeginFunc(ctx, st.Pool(), func(tx pgx.Tx) error {
		if _, err := st.Claim(ctx, tx, store.ClaimRequest{Consumer: "loyalty", Key: "order-completed:42", PayloadHash: []byte("0123456789abcdef")}); err != nil {
			return err
		}
		return st.Enqueue(ctx, tx, "receipts", message.NewMessage("r1", []byte("{}")))
	}))
	out = c.ok("explain", "--consumer", "loyalty", "--key", "order-completed:42")
	require.Contains(t, out, "1 rows written in that transaction")
	c.recordMemo("loyalty", "order-completed:9", "customer_id is missing")
	require.Contains(t, c.ok("unpoison", "--consumer", "loyalty", "--key", "order-completed:9"), "cleared 1 poison memos")

	c.ok("partitions", "enable")
	c.ok("partitions", "create-ahead")
	c.ok("partitions", "drop-expired")
	require.Contains(t, c.ok("stats"), "partitioned")

	// The console's pages, on its own pool through the pooler.
	cctx, cancel := context.WithCancel(ctx)
	con := startConsole(cctx, t, Config{}, "--database-url", bouncer, "--schema", c.schema)
	for range 3 {
		require.Contains(t, con.get("/"), "loyalty")
	}
	require.Contains(t, con.get("/lookup?consumer=loyalty&key=order-completed%3A42"), "order-completed:42")
	cancel()
	require.Equal(t, exitOK, <-con.done, "output: %s", con.out)
}
