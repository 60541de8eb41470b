package claimtxcli

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/internal/pg"
)

// parkedCLI is a migrated schema where consumer loyalty has order key
// customer-7 parked: order 2 failed, 3 behind it.
func parkedCLI(t *testing.T) *cli {
	t.Helper()
	c := migratedCLI(t)
	c.exec(`INSERT INTO processed_messages_parked_keys (consumer, order_key, reason) VALUES ('loyalty', 'customer-7', 'total_cents: not a number')`)
	c.exec(`INSERT INTO processed_messages_parked (consumer, order_key, message_key, uuid, payload, metadata, reason) VALUES
		('loyalty', 'customer-7', 'order-completed:2', 'u-2', '{"order_id": 2}', '{"event_id": "e-2"}', 'total_cents: not a number'),
		('loyalty', 'customer-7', 'order-completed:3', 'u-3', '{"order_id": 3}', '{}', NULL)`)
	return c
}

func TestCLIParked(t *testing.T) {
	t.Parallel()
	c := parkedCLI(t)

	out := c.ok("parked", "list")
	require.Contains(t, out, "customer-7")
	require.Contains(t, out, "total_cents: not a number")
	require.Contains(t, out, "on request")
	var keys []pg.ParkedKey
	require.NoError(t, json.Unmarshal([]byte(c.ok("parked", "list", "--consumer", "loyalty", "--json")), &keys))
	require.Len(t, keys, 1)
	require.Equal(t, int64(2), keys[0].Messages)
	require.Nil(t, keys[0].RetryAt, "no release asked for")
	require.Contains(t, c.ok("parked", "list", "--consumer", "billing"), "no parked order keys")

	out = c.ok("parked", "show", "--consumer", "loyalty", "--key", "customer-7")
	require.Contains(t, out, "order-completed:2")
	require.Contains(t, out, "(behind the head)")
	require.Contains(t, out, `{"order_id": 3}`)
	var shown struct {
		Key      pg.ParkedKey       `json:"key"`
		Messages []pg.ParkedMessage `json:"messages"`
	}
	require.NoError(t, json.Unmarshal([]byte(c.ok("parked", "show", "--consumer", "loyalty", "--key", "customer-7", "--json")), &shown))
	require.Len(t, shown.Messages, 2)
	require.Equal(t, "e-2", shown.Messages[0].Metadata["event_id"])
	require.Equal(t, `{"order_id": 2}`, string(shown.Messages[0].Payload))

	require.Contains(t, c.ok("parked", "retry", "--consumer", "loyalty", "--key", "customer-7", "--by", "ops"), "requested a retry of 1 parked order keys")
	require.NoError(t, json.Unmarshal([]byte(c.ok("parked", "list", "--json")), &keys))
	require.NotNil(t, keys[0].RetryAt, "due now")
	require.Equal(t, "ops", keys[0].RequestedBy)
	require.False(t, keys[0].SkipHead)
	require.Contains(t, c.ok("parked", "list"), "retry requested by ops")

	var req struct {
		Requested []string `json:"requested"`
		Skip      bool     `json:"skip"`
	}
	require.NoError(t, json.Unmarshal([]byte(c.ok("parked", "skip", "--consumer", "loyalty", "--all", "--note", "cancelled upstream", "--json")), &req))
	require.Equal(t, []string{"customer-7"}, req.Requested)
	require.True(t, req.Skip)
	require.NoError(t, json.Unmarshal([]byte(c.ok("parked", "list", "--json")), &keys))
	require.True(t, keys[0].SkipHead)
	require.Equal(t, "cancelled upstream", keys[0].RequestNote)
	require.Contains(t, c.ok("parked", "list"), "skip requested by")

	// stats counts them.
	require.Contains(t, c.ok("stats"), "PARKED KEYS")
	var stats struct {
		Parked []pg.ParkedStats `json:"parked"`
	}
	require.NoError(t, json.Unmarshal([]byte(c.ok("stats", "--json")), &stats))
	require.Equal(t, []pg.ParkedStats{{Consumer: "loyalty", Keys: 1, Messages: 2, Oldest: stats.Parked[0].Oldest}}, stats.Parked)

	// --all is every key, not the first --limit of them.
	c.exec(`INSERT INTO processed_messages_parked_keys (consumer, order_key, reason) SELECT 'bulk', 'k-' || i, 'r' FROM generate_series(1, 150) i`)
	require.NoError(t, json.Unmarshal([]byte(c.ok("parked", "retry", "--consumer", "bulk", "--all", "--json")), &req))
	require.Len(t, req.Requested, 150)

	code, _, errOut := c.run("parked", "retry", "--consumer", "loyalty", "--key", "customer-8")
	require.Equal(t, exitFail, code)
	require.Contains(t, errOut, `order key "customer-8" of consumer "loyalty" is not parked`)
	code, _, errOut = c.run("parked", "show", "--consumer", "loyalty", "--key", "customer-8")
	require.Equal(t, exitFail, code)
	require.Contains(t, errOut, "is not parked")

	c.refuses([]usageCase{
		{[]string{"parked"}, "want a subcommand"},
		{[]string{"parked", "drop"}, "unknown subcommand"},
		{[]string{"parked", "show", "--key", "k"}, "--consumer"},
		{[]string{"parked", "show", "--consumer", "loyalty"}, "--key is required"},
		{[]string{"parked", "retry", "--consumer", "loyalty"}, "give --key or --all"},
		{[]string{"parked", "retry", "--consumer", "loyalty", "--key", "k", "--all"}, "give --key or --all"},
		{[]string{"parked", "skip", "--consumer", "loyalty", "--key", "customer-7"}, "--note is required"},
		{[]string{"parked", "list", "--all"}, "not defined"},
		{[]string{"parked", "list", "--limit", "0"}, "--limit must be positive"},
		{[]string{"parked", "list", "--key", "k"}, "not defined"},
		{[]string{"parked", "retry", "--consumer", "loyalty", "--all", "--limit", "5"}, "not defined"},
	})
}
