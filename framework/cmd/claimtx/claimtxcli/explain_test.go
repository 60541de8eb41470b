package claimtxcli

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/framework/cmd/claimtx/internal/explain"
	"github.com/claimtx/claimtx/internal/pg"
	"github.com/claimtx/claimtx/store"
)

func (c *cli) names() *pg.Names { return pg.NewNames(c.schema, "processed_messages", "outbox") }

func (c *cli) recordMemo(consumer, key, reason string) {
	c.t.Helper()
	require.NoError(c.t, pg.MemosOf(c.store().Pool(), c.names()).Record(context.Background(), consumer, key, errors.New(reason)))
}

func (c *cli) memos(consumer string) int64 {
	c.t.Helper()
	n, err := pg.MemosOf(c.store().Pool(), c.names()).Count(context.Background(), pg.MemoFilter{Consumer: consumer})
	require.NoError(c.t, err)
	return n
}

func TestCLIUnpoison(t *testing.T) {
	t.Parallel()
	c := migratedCLI(t)
	c.recordMemo("loyalty", "order-completed:1", "loyalty: bad OrderCompleted event: customer_id is missing")
	c.recordMemo("loyalty", "order-completed:2", "loyalty: bad OrderCompleted event: customer_id is missing")
	c.recordMemo("loyalty", "order-completed:3", "order 3 refused: 100% off")
	c.recordMemo("loyalty", "order-completed:4", "timeout")
	c.recordMemo("analytics", "order-completed:1", "customer_id is missing")
	c.exec(`UPDATE ` + pgx.Identifier{c.schema, "processed_messages_poison_memo"}.Sanitize() + ` SET poisoned_at = now() - interval '8 days' WHERE message_key = 'order-completed:4'`)

	out := c.ok("unpoison", "--consumer", "loyalty", "--reason-contains", "customer_id is missing", "--dry-run")
	require.Contains(t, out, "dry run: 2 poison memos of consumer loyalty would be cleared")
	require.EqualValues(t, 4, c.memos("loyalty"))

	require.Contains(t, c.ok("unpoison", "--consumer", "loyalty", "--key", "order-completed:1", "--key", "order-completed:9"), "cleared 1 poison memos of consumer loyalty")
	// Reasons match literally: % is not a wildcard.
	require.Contains(t, c.ok("unpoison", "--consumer", "loyalty", "--reason-contains", "100%"), "cleared 1 poison memos")
	require.Contains(t, c.ok("unpoison", "--consumer", "loyalty", "--reason-contains", "%", "--dry-run"), "dry run: 0 poison memos")
	require.Contains(t, c.ok("unpoison", "--consumer", "loyalty", "--older-than", "7d"), "cleared 1 poison memos")
	require.EqualValues(t, 1, c.memos("loyalty"))
	require.Contains(t, c.ok("unpoison", "--consumer", "loyalty"), "cleared 1 poison memos")
	require.EqualValues(t, 1, c.memos("analytics"), "another consumer's memos are untouched")

	help := c.ok("unpoison", "-h")
	require.Contains(t, help, "Examples:")
	require.Contains(t, help, "claimtx unpoison --consumer loyalty --key order-completed:9912")
	require.Contains(t, help, "--reason-contains")

	c.refuses([]usageCase{
		{[]string{"unpoison"}, "--consumer is required"},
		{[]string{"unpoison", "--consumer", "loyalty", "--key", ""}, "--key must not be empty"},
		{[]string{"unpoison", "--consumer", "loyalty", "--older-than", "soon"}, "not a duration"},
		{[]string{"unpoison", "--consumer", "loyalty", "stray"}, `unexpected argument "stray"`},
	})

	// A schema without the memo table says what to do.
	fresh := newCLI(t)
	code, _, errOut := fresh.run("unpoison", "--consumer", "loyalty")
	require.Equal(t, exitFail, code)
	require.Contains(t, errOut, "claimtx migrate")
}

func TestCLIExplain(t *testing.T) {
	t.Parallel()
	c := migratedCLI(t)
	st := c.store()
	ctx := context.Background()
	outbox := pgx.Identifier{c.schema, "outbox"}.Sanitize()

	// Order 42 applied, with three outbox rows in its transaction; another
	// transaction's row must not show.
	require.NoError(t, pgx.BeginFunc(ctx, st.Pool(), func(tx pgx.Tx) error {
		if _, err := st.Claim(ctx, tx, store.ClaimRequest{Consumer: "loyalty", Key: "order-completed:42", PayloadHash: []byte("0123456789abcdef")}); err != nil {
			return err
		}
		if err := st.Enqueue(ctx, tx, "receipts", message.NewMessage("r1", []byte("{}")), message.NewMessage("r2", []byte("{}"))); err != nil {
			return err
		}
		return st.Enqueue(ctx, tx, "points", message.NewMessage("p1", []byte("{}")))
	}))
	require.NoError(t, pgx.BeginFunc(ctx, st.Pool(), func(tx pgx.Tx) error {
		return st.Enqueue(ctx, tx, "receipts", message.NewMessage("other", []byte("{}")))
	}))
	c.exec(`UPDATE ` + outbox + ` SET sent_at = now() WHERE uuid = 'r1'`)
	c.exec(`UPDATE ` + outbox + ` SET attempts = 2, last_error = 'broker down' WHERE uuid = 'r2'`)

	out := c.ok("explain", "--consumer", "loyalty", "--key", "order-completed:42")
	require.Contains(t, out, `consumer loyalty, key "order-completed:42"`)
	require.Contains(t, out, "payload fingerprint stored")
	require.Regexp(t, `transaction:\s+\d+`, out)
	require.Contains(t, out, "3 rows written in that transaction")
	require.Regexp(t, `receipts\s+\S+\s+sent\s`, out)
	require.Regexp(t, `receipts\s+\S+\s+failing\s+-\s+2\s+broker down`, out)
	require.Regexp(t, `points\s+\S+\s+pending\s`, out)
	require.Contains(t, out, "poison memo:  none")
	require.NotContains(t, out, "partition")

	var rep explain.Report
	require.NoError(t, json.Unmarshal([]byte(c.ok("explain", "--consumer", "loyalty", "--key", "order-completed:42", "--json")), &rep))
	require.NotNil(t, rep.Claim)
	require.NotNil(t, rep.Claim.Transaction)
	require.True(t, rep.Claim.Fingerprint)
	require.Len(t, rep.Outbox, 3)
	require.Equal(t, []string{"sent", "failing", "pending"}, []string{rep.Outbox[0].Status, rep.Outbox[1].Status, rep.Outbox[2].Status})
	require.Nil(t, rep.Memo)

	// Not found: exit status 1, the report still printed, the reason on
	// stderr.
	code, out, errOut := c.run("explain", "--consumer", "loyalty", "--key", "order-completed:43")
	require.Equal(t, exitFail, code)
	require.Contains(t, out, "claim:        none")
	require.Contains(t, errOut, `no claim and no poison memo for consumer loyalty, key "order-completed:43"`)
	code, out, _ = c.run("explain", "--consumer", "loyalty", "--key", "order-completed:43", "--json")
	require.Equal(t, exitFail, code)
	require.NoError(t, json.Unmarshal([]byte(out), &rep))
	require.False(t, rep.Found())

	// A poisoned order: found by its memo, with the command that clears it.
	c.recordMemo("loyalty", "order-completed:43", "loyalty: bad OrderCompleted event: customer_id is missing")
	c.recordMemo("loyalty", "order-completed:43", "again")
	out = c.ok("explain", "--consumer", "loyalty", "--key", "order-completed:43")
	require.Contains(t, out, "claim:        none")
	require.Regexp(t, `poisoned 2 times, last \S+: again`, out)
	require.Contains(t, out, "claimtx unpoison --consumer loyalty --key order-completed:43")

	// A claim from before migration 005: unknown transaction.
	c.exec(`INSERT INTO ` + pgx.Identifier{c.schema, "processed_messages"}.Sanitize() + ` (consumer, message_key, xact) VALUES ('loyalty', 'legacy', NULL)`)
	out = c.ok("explain", "--consumer", "loyalty", "--key", "legacy")
	require.Contains(t, out, "transaction:  unknown")
	require.NotContains(t, out, "outbox:")

	// By message file and key spec: a metadata key, and a payload field
	// of a JSON payload or of a payload given as a string.
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, []byte(body), 0o600))
		return p
	}
	byMeta := write("meta.json", `{"metadata": {"event_id": "order-completed:42"}, "payload": "not json"}`)
	require.Contains(t, c.ok("explain", "--consumer", "loyalty", "--message", byMeta, "--key-spec", "metadata:event_id"), `key "order-completed:42"`)
	byField := write("field.json", `{"metadata": {}, "payload": {"order_id": 42.0, "customer_id": 7}}`)
	require.Contains(t, c.ok("explain", "--consumer", "loyalty", "--message", byField, "--key-spec", "template:order-completed:{payload.order_id}"), "3 rows written")
	byString := write("string.json", `{"payload": "{\"order_id\": 42}"}`)
	require.Contains(t, c.ok("explain", "--consumer", "loyalty", "--message", byString, "--key-spec", "template:order-completed:{payload.order_id}"), "3 rows written")

	c.refuses([]usageCase{
		{[]string{"explain", "--key", "k"}, "--consumer is required"},
		{[]string{"explain", "--consumer", "loyalty"}, "give --key, or --message"},
		{[]string{"explain", "--consumer", "loyalty", "--key", "k", "--message", byMeta}, "not both"},
		{[]string{"explain", "--consumer", "loyalty", "--message", byMeta}, "--message needs --key-spec"},
		{[]string{"explain", "--consumer", "loyalty", "--message", byMeta, "--key-spec", "nonsense:x"}, "--key-spec"},
		{[]string{"explain", "--consumer", "loyalty", "--message", write("bad.json", `{"payload": {}, "extra": 1}`), "--key-spec", "json:order_id"}, "want a JSON object"},
		{[]string{"explain", "--consumer", "loyalty", "--message", write("nokey.json", `{"payload": {"x": 1}}`), "--key-spec", "json:order_id"}, "no key with --key-spec json:order_id"},
		{[]string{"explain", "--consumer", "loyalty", "--message", filepath.Join(dir, "missing.json"), "--key-spec", "json:order_id"}, "no such file"},
		{[]string{"explain", "--consumer", "loyalty", "--key", "k", "--outbox-table", "Bad-Name"}, "--outbox-table"},
	})
	help := c.ok("explain", "-h")
	require.Contains(t, help, "Examples:")
	require.Contains(t, help, "Exit status: 0 when a claim or a poison memo exists, 1 when neither does")
}

// A claim in a table partitioned by event day shows its day and
// partition.
func TestCLIExplainPartitioned(t *testing.T) {
	t.Parallel()
	c := migratedCLI(t)
	c.ok("partitions", "enable")
	st := c.store()
	ctx := context.Background()
	day := time.Now().UTC()
	require.NoError(t, pgx.BeginFunc(ctx, st.Pool(), func(tx pgx.Tx) error {
		_, err := st.Claim(ctx, tx, store.ClaimRequest{Consumer: "loyalty", Key: "order-completed:7", EventTime: day})
		return err
	}))
	out := c.ok("explain", "--consumer", "loyalty", "--key", "order-completed:7")
	require.Contains(t, out, "event day "+day.Format(time.DateOnly)+", partition processed_messages_p"+day.Format("20060102"))
	require.Contains(t, out, "no payload fingerprint")
	require.Contains(t, out, "no rows written in that transaction")
	var rep explain.Report
	require.NoError(t, json.Unmarshal([]byte(c.ok("explain", "--consumer", "loyalty", "--key", "order-completed:7", "--json")), &rep))
	require.Equal(t, "processed_messages_p"+day.Format("20060102"), rep.Claim.Partition)
	require.Equal(t, day.Format(time.DateOnly), rep.Claim.EventDay.Format(time.DateOnly))
	require.NotEmpty(t, strconv.FormatUint(*rep.Claim.Transaction, 10))
}
