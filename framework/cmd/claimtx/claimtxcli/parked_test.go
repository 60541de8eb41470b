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

// parkedShown is what parked show --json prints.
type parkedShown struct {
	Key      pg.ParkedKey       `json:"key"`
	Messages []pg.ParkedMessage `json:"messages"`
}

// parkedRequested is what parked retry|skip --json prints.
type parkedRequested struct {
	Requested []string `json:"requested"`
	Skip      bool     `json:"skip"`
}

// decode is out's JSON as a T.
func decode[T any](t *testing.T, out string) T {
	t.Helper()
	var v T
	require.NoError(t, json.Unmarshal([]byte(out), &v), out)
	return v
}

func TestCLIParked(t *testing.T) {
	t.Parallel()
	c := parkedCLI(t)
	// The steps run in order on one schema: the requests build on each other.
	for _, step := range []struct {
		name  string
		args  []string
		code  int      // exitOK unless set
		want  []string // in stdout, or in stderr when failing
		check func(t *testing.T, out string)
	}{
		{name: "list", args: []string{"parked", "list"}, want: []string{"customer-7", "total_cents: not a number", "on request"}},
		{name: "list json", args: []string{"parked", "list", "--consumer", "loyalty", "--json"}, check: func(t *testing.T, out string) {
			keys := decode[[]pg.ParkedKey](t, out)
			require.Len(t, keys, 1)
			require.Equal(t, int64(2), keys[0].Messages)
			require.Nil(t, keys[0].RetryAt, "no release asked for")
		}},
		{name: "list of a consumer without", args: []string{"parked", "list", "--consumer", "billing"}, check: func(t *testing.T, out string) {
			require.Equal(t, "no parked order keys\n", out, "no header without rows")
		}},
		{name: "show", args: []string{"parked", "show", "--consumer", "loyalty", "--key", "customer-7"}, want: []string{"order-completed:2", "(behind the head)", `{"order_id": 3}`}},
		{name: "show json", args: []string{"parked", "show", "--consumer", "loyalty", "--key", "customer-7", "--json"}, check: func(t *testing.T, out string) {
			shown := decode[parkedShown](t, out)
			require.Len(t, shown.Messages, 2)
			require.Equal(t, "e-2", shown.Messages[0].Metadata["event_id"])
			require.Equal(t, `{"order_id": 2}`, string(shown.Messages[0].Payload))
		}},
		{name: "retry", args: []string{"parked", "retry", "--consumer", "loyalty", "--key", "customer-7", "--by", "ops"}, want: []string{"requested a retry of 1 parked order keys"}},
		{name: "retry pending", args: []string{"parked", "list", "--json"}, check: func(t *testing.T, out string) {
			keys := decode[[]pg.ParkedKey](t, out)
			require.NotNil(t, keys[0].RetryAt, "due now")
			require.Equal(t, "ops", keys[0].RequestedBy)
			require.False(t, keys[0].SkipHead)
		}},
		{name: "retry pending text", args: []string{"parked", "list"}, want: []string{"retry requested by ops"}},
		{name: "skip all json", args: []string{"parked", "skip", "--consumer", "loyalty", "--all", "--note", "cancelled upstream", "--json"}, check: func(t *testing.T, out string) {
			req := decode[parkedRequested](t, out)
			require.Equal(t, []string{"customer-7"}, req.Requested)
			require.True(t, req.Skip)
		}},
		{name: "skip pending", args: []string{"parked", "list", "--json"}, check: func(t *testing.T, out string) {
			keys := decode[[]pg.ParkedKey](t, out)
			require.True(t, keys[0].SkipHead)
			require.Equal(t, "cancelled upstream", keys[0].RequestNote)
		}},
		{name: "skip pending text", args: []string{"parked", "list"}, want: []string{"skip requested by"}},
		{name: "stats", args: []string{"stats"}, check: func(t *testing.T, out string) {
			require.Regexp(t, `CONSUMER +PARKED KEYS +PARKED MESSAGES +OLDEST PARKED\nloyalty +1 +2 +\S+ ago`, out)
		}},
		{name: "stats json", args: []string{"stats", "--json"}, check: func(t *testing.T, out string) {
			stats := decode[struct {
				Parked []pg.ParkedStats `json:"parked"`
			}](t, out)
			require.Equal(t, []pg.ParkedStats{{Consumer: "loyalty", Keys: 1, Messages: 2, Oldest: stats.Parked[0].Oldest}}, stats.Parked)
		}},
		{name: "retry not parked", args: []string{"parked", "retry", "--consumer", "loyalty", "--key", "customer-8"}, code: exitFail,
			want: []string{`order key "customer-8" of consumer "loyalty" is not parked`}},
		{name: "skip not parked", args: []string{"parked", "skip", "--consumer", "loyalty", "--key", "customer-8", "--note", "n"}, code: exitFail, want: []string{"is not parked"}},
		{name: "show not parked", args: []string{"parked", "show", "--consumer", "loyalty", "--key", "customer-8"}, code: exitFail, want: []string{"is not parked"}},
		{name: "retry all of none", args: []string{"parked", "retry", "--consumer", "billing", "--all"}, want: []string{"requested a retry of 0 parked order keys"}},
	} {
		code, out, errOut := c.run(step.args...)
		require.Equal(t, step.code, code, "%s: %v\nstdout: %s\nstderr: %s", step.name, step.args, out, errOut)
		shown := out
		if step.code != exitOK {
			shown = errOut
		}
		for _, w := range step.want {
			require.Contains(t, shown, w, step.name)
		}
		if step.check != nil {
			step.check(t, out)
		}
	}

	// --all is every key, not the first --limit of them.
	c.exec(`INSERT INTO processed_messages_parked_keys (consumer, order_key, reason) SELECT 'bulk', 'k-' || i, 'r' FROM generate_series(1, 150) i`)
	require.Len(t, decode[parkedRequested](t, c.ok("parked", "retry", "--consumer", "bulk", "--all", "--json")).Requested, 150)

	for _, sub := range []string{"list", "show", "retry", "skip"} {
		out := c.ok("parked", sub, "-h")
		require.Contains(t, out, "Example:\n  claimtx parked "+sub)
	}
	require.Contains(t, c.ok("parked", "-h"), "ORDER_KEY")

	c.refuses([]usageCase{
		{[]string{"parked"}, "want a subcommand"},
		{[]string{"parked", "drop"}, "unknown subcommand"},
		{[]string{"parked", "show", "--key", "k"}, "--consumer"},
		{[]string{"parked", "show", "--consumer", "loyalty"}, "--key is required"},
		{[]string{"parked", "retry", "--consumer", "loyalty"}, "give --key or --all"},
		{[]string{"parked", "retry", "--consumer", "loyalty", "--key", "k", "--all"}, "give --key or --all"},
		{[]string{"parked", "skip", "--consumer", "loyalty", "--key", "customer-7"}, "--note is required"},
		{[]string{"parked", "skip", "--consumer", "loyalty", "--all", "--note", " "}, "--note is required"},
		{[]string{"parked", "list", "--all"}, "not defined"},
		{[]string{"parked", "list", "--limit", "0"}, "--limit must be positive"},
		{[]string{"parked", "list", "--key", "k"}, "not defined"},
		{[]string{"parked", "retry", "--consumer", "loyalty", "--all", "--limit", "5"}, "not defined"},
	})
}
