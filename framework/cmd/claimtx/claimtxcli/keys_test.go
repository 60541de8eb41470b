package claimtxcli

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/brokers"
	"github.com/claimtx/claimtx/framework/cmd/claimtx/internal/dlq/dlqtest"
	"github.com/claimtx/claimtx/framework/cmd/claimtx/internal/keycheck"
)

// `claimtx keys check` samples a queue or topic without consuming it and
// exits 1 when the key spec lets different payloads share a key.
func TestCLIKeysCheck(t *testing.T) {
	dlqtest.EachBroker(t, 1, func(t *testing.T, w *dlqtest.World) {
		c, broker := dlqCLI(t, w)
		var msgs []*message.Message
		for i := 1; i <= 40; i++ {
			m := dlqtest.Order(i)
			m.Metadata.Set("event_time", "2026-01-02T03:04:05Z")
			msgs = append(msgs, m)
		}
		msgs = append(msgs, dlqtest.Order(3)) // a redelivery
		w.Publish(w.Topic, msgs...)
		args := func(a ...string) []string { return append(append([]string{"keys", "check"}, a...), broker...) }

		out := c.ok(args("--key-spec", "metadata:event_id", "--time-spec", "metadata:event_time")...)
		require.Contains(t, out, "over 41 messages of ")
		require.Contains(t, out, "keyed 41, distinct keys 40, duplicates 1")
		require.Contains(t, out, "key length in bytes: min 5, p50 6, p90 6, p99 6, max 6")
		require.Contains(t, out, "event time (metadata:event_time): 40 with; 1 without")
		require.Contains(t, out, "OK: no key is shared by different payloads")
		require.Equal(t, 41, w.Depth(w.Topic), "nothing consumed")

		// Keyed by customer: seven customers, forty orders.
		code, out, errOut := c.run(args("--key-spec", "json:customer_id", "--json")...)
		require.Equal(t, exitFail, code, "%s %s", out, errOut)
		require.Contains(t, errOut, "7 keys are shared by different payloads")
		var rep keycheck.Report
		require.NoError(t, json.Unmarshal([]byte(out), &rep))
		require.Len(t, rep.Collisions, 7)
		require.Equal(t, 41, w.Depth(w.Topic), "nothing consumed")

		// --limit samples the first messages.
		out = c.ok(args("--key-spec", "metadata:event_id", "--limit", "10")...)
		require.Contains(t, out, "over 10 messages")
		if w.Kind != brokers.KindKafka {
			require.Equal(t, 41, w.Depth(w.Topic), "the sampled messages are back")
		}
	})
}

func TestCLIKeysCheckFile(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	file := filepath.Join(dir, "sample.jsonl")
	lines := []string{
		`{"id": "a", "metadata": {"event_id": "e1", "trace": "t1"}, "payload": "{\"order_id\": 1}"}`,
		`{"id": "b", "metadata": {"event_id": "e2", "trace": "t2"}, "payload": "{\"order_id\": 1}"}`,
		`{"uuid": "c", "metadata": {"event_id": "e3"}, "payload_base64": "eyJvcmRlcl9pZCI6IDJ9"}`,
		``,
		`{"id": "d", "payload": "not json"}`,
	}
	require.NoError(t, os.WriteFile(file, []byte(strings.Join(lines, "\n")+"\n"), 0o600))
	c := newCLI(t)
	// A trace id in the key: one payload under two keys, no collision.
	out := c.ok("keys", "check", "--file", file, "--key-spec", "template:{metadata.event_id}:{metadata.trace}")
	require.Contains(t, out, "over 4 messages of file "+file)
	require.Contains(t, out, "volatile keys: 1 payloads arrived under several keys")
	require.Contains(t, out, "keys e1:t1, e2:t2 (ids a, b)")
	require.Contains(t, out, "unkeyable: 2 messages")
	require.Contains(t, out, "OK:")
	// Keyed by order id: e1 and e2 are the same order, a and b alike;
	// no collision either, "d" cannot be keyed.
	code, out, errOut := c.run("keys", "check", "--file", file, "--key-spec", "json:order_id")
	require.Equal(t, exitOK, code, "%s %s", out, errOut)
	require.Contains(t, out, "duplicates 1")

	c.refuses([]usageCase{
		{[]string{"keys"}, "want a subcommand: check"},
		{[]string{"keys", "verify"}, `unknown subcommand "verify"`},
		{[]string{"keys", "check", "--file", file}, "no key spec"},
		{[]string{"keys", "check", "--key-spec", "json:id"}, "nothing to sample"},
		{[]string{"keys", "check", "--key-spec", "json:id", "--file", file, "--topic", "x"}, "not both"},
		{[]string{"keys", "check", "--key-spec", "bogus:x", "--file", file}, `--key-spec "bogus:x"`},
		{[]string{"keys", "check", "--key-spec", "json:id", "--time-spec", "bogus:x", "--file", file}, `--time-spec "bogus:x"`},
		{[]string{"keys", "check", "--key-spec", "json:id", "--file", file, "--database-url", "x"}, "database-url"},
	})
	bad := filepath.Join(dir, "bad.jsonl")
	require.NoError(t, os.WriteFile(bad, []byte("{\"id\": \"a\"}\n[1, 2\n"), 0o600))
	code, _, errOut = c.run("keys", "check", "--key-spec", "json:id", "--file", bad)
	require.Equal(t, exitUsage, code)
	require.Contains(t, errOut, "line 2: not a JSON object")
	out = c.ok("keys", "check", "-h")
	require.Contains(t, out, "Example:")
}
