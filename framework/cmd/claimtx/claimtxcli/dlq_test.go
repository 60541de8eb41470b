package claimtxcli

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/brokers"
	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/framework/cmd/claimtx/internal/dlq"
	"github.com/claimtx/claimtx/framework/cmd/claimtx/internal/dlq/dlqtest"
	"github.com/claimtx/claimtx/internal/testenv"
)

const dlqKeySpec = "template:order:{payload.order_id}"

// dlqCLI is the CLI against w's database, schema and broker (as flags:
// the broker variables are the process's, read by brokers.LoadConfig("");
// NATS is the local server, NATS_URL's default).
func dlqCLI(t *testing.T, w *dlqtest.World) (*cli, []string) {
	c := &cli{t: t, schema: w.Schema, env: map[string]string{"DATABASE_URL": testenv.URL()}}
	flags := []string{"--broker", w.Kind, "--topic", w.Topic}
	switch w.Kind {
	case brokers.KindKafka:
		flags = append(flags, "--kafka-brokers", w.KafkaAddr)
	case brokers.KindAMQP:
		flags = append(flags, "--amqp-url", dlqtest.AMQPURL)
	}
	return c, flags
}

func jsonLines(t *testing.T, out string) []map[string]any {
	t.Helper()
	var rows []map[string]any
	sc := bufio.NewScanner(strings.NewReader(out))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var m map[string]any
		require.NoError(t, json.Unmarshal(sc.Bytes(), &m), "line %q", sc.Text())
		rows = append(rows, m)
	}
	return rows
}

// `claimtx dlq` end to end on both brokers: list (table and JSON, with
// filters), inspect, a dry run that classifies and changes nothing, a
// replay, and the help of each subcommand.
func TestCLIDLQ(t *testing.T) {
	dlqtest.EachBroker(t, 1, func(t *testing.T, w *dlqtest.World) {
		c, broker := dlqCLI(t, w)
		orders := dlqtest.Orders(1, 6)
		bad := dlqtest.Order(7)
		bad.Payload = []byte(`{"order": "seven"}`)
		copies := w.Poisoned("loyalty", dlqKeySpec, framework.Permanent(errors.New("cannot decode: schema v2")), append(orders, bad)...)
		copies = append(copies, w.Poisoned("analytics", dlqKeySpec, errors.New("handler timeout"), dlqtest.Order(8))...)
		w.Publish(w.Poison, copies...)
		w.Claim("loyalty", "order:1", dlq.Fingerprint(orders[0].Payload))
		w.Claim("loyalty", "order:2", dlq.Fingerprint([]byte("another payload")))
		args := func(a ...string) []string { return append(append([]string{"dlq"}, a...), broker...) }

		out := c.ok(args("list")...)
		require.Contains(t, out, "POSITION")
		require.Contains(t, out, "cannot decode: schema v2")
		require.Contains(t, out, "order:3")
		require.Contains(t, out, "analytics")
		require.Contains(t, out, "8 letters read from "+w.Poison+", 8 selected")

		rows := jsonLines(t, c.ok(args("list", "--json", "--consumer", "loyalty", "--reason", "schema v2")...))
		require.Len(t, rows, 7)
		require.Equal(t, "order-1", rows[0]["id"])
		require.Equal(t, w.Topic, rows[0]["original_topic"])
		require.Equal(t, "loyalty", rows[0]["consumer"])
		require.Equal(t, "order:1", rows[0]["poisoned_key"])
		require.Equal(t, true, rows[0]["permanent"])
		require.NotEmpty(t, rows[0]["poisoned_at"])
		require.Equal(t, dlq.Fingerprint(orders[0].Payload), mustHex(t, rows[0]["fingerprint"]))

		rows = jsonLines(t, c.ok(args("list", "--json", "--key", "order:5")...))
		require.Len(t, rows, 1)
		require.Equal(t, "order-5", rows[0]["id"])

		out = c.ok(args("inspect", "--id", "order-2", "--consumer", "loyalty", "--key-spec", dlqKeySpec)...)
		require.Contains(t, out, "letter order-2 at ")
		require.Contains(t, out, "event_id = evt-2")
		require.Contains(t, out, "traceparent = ")
		require.Contains(t, out, `"order_id": 2`)
		require.Contains(t, out, "ALREADY-APPLIED-DIFFERENT-PAYLOAD")
		require.NotContains(t, out, "order-3")

		before := w.Read(w.Poison)
		out = c.ok(args("replay", "--dry-run", "--consumer", "loyalty", "--key-spec", dlqKeySpec)...)
		require.Contains(t, out, "already applied   2")
		require.Contains(t, out, "would apply       4")
		require.Contains(t, out, "still bad         1")
		require.Contains(t, out, "WARNING: 1 already applied with a DIFFERENT payload fingerprint")
		require.Contains(t, out, "not selected: 1 of other consumers")
		require.Contains(t, out, "dry run: 4 would be replayed to "+w.Topic)
		require.Contains(t, out, "would replay")
		require.Len(t, w.Read(w.Poison), len(before), "a dry run changes nothing")
		require.Zero(t, w.Depth(w.Topic))

		rows = jsonLines(t, c.ok(args("replay", "--json", "--consumer", "loyalty", "--key-spec", dlqKeySpec, "--batch-size", "3")...))
		require.Len(t, rows, 9, "8 letters and the totals")
		replayed := 0
		for _, r := range rows[:8] {
			if r["replayed"] == true {
				replayed++
				require.Equal(t, "would-apply", r["class"])
			}
		}
		require.Equal(t, 4, replayed)
		totals := rows[8]["totals"].(map[string]any)
		require.EqualValues(t, 4, totals["Replayed"])
		require.Equal(t, true, rows[8]["complete"])
		require.Len(t, w.Read(w.Topic), 4)

		out = c.ok(args("replay", "--consumer", "loyalty", "--key-spec", dlqKeySpec)...)
		require.Contains(t, out, "0 replayed to "+w.Topic)
		require.Len(t, w.Read(w.Topic), 4)

		for _, sub := range []string{"list", "inspect", "replay"} {
			out := c.ok("dlq", sub, "-h")
			require.Contains(t, out, "Example:")
			require.Contains(t, out, "claimtx dlq "+sub)
			require.Contains(t, out, "--key-spec")
		}
		require.Contains(t, c.ok("dlq", "-h"), "replay")
	})
}

func mustHex(t *testing.T, v any) []byte {
	t.Helper()
	s, ok := v.(string)
	require.True(t, ok)
	var b []byte
	_, err := fmt.Sscanf(s, "%x", &b)
	require.NoError(t, err)
	return b
}

func TestCLIDLQBadInput(t *testing.T) {
	t.Parallel()
	c := migratedCLI(t)
	c.refuses([]usageCase{
		{[]string{"dlq"}, "want a subcommand"},
		{[]string{"dlq", "purge"}, `unknown subcommand "purge"`},
		{[]string{"dlq", "list"}, "no destination: pass --topic"},
		{[]string{"dlq", "replay", "--poison-topic", "x.poison"}, "replay needs --topic"},
		{[]string{"dlq", "replay", "--topic", "x"}, "replay needs --consumer"},
		{[]string{"dlq", "replay", "--topic", "x", "--consumer", "c"}, "--key-spec or set KEY"},
		{[]string{"dlq", "replay", "--topic", "x", "--consumer", "c", "--key-spec", "nonsense:x"}, `--key-spec "nonsense:x"`},
		{[]string{"dlq", "list", "--topic", "x", "--key-spec", "json:id"}, "pass it too"},
		{[]string{"dlq", "list", "--topic", "x", "--progress", "sparkles"}, "--progress"},
		{[]string{"dlq", "list", "--topic", "x", "--older-than", "a while"}, "not a duration"},
		{[]string{"dlq", "list", "--topic", "x", "--broker", "gochannel"}, "amqp, kafka and nats only"},
		{[]string{"dlq", "replay", "--topic", "x", "--consumer", "c", "--key-spec", "json:id", "--rate", "-1"}, "must not be negative"},
	})
	// A poison queue that does not exist is named; nothing is created.
	code, _, errOut := c.run("dlq", "list", "--topic", "no-such-topic-"+c.schema, "--amqp-url", dlqtest.AMQPURL, "--broker", "amqp")
	require.Equal(t, exitFail, code)
	require.Contains(t, errOut, `"no-such-topic-`+c.schema+`.poison" does not exist`)
	code, _, errOut = c.run("dlq", "list", "--topic", "no-such-topic-"+c.schema, "--broker", "nats")
	require.Equal(t, exitFail, code)
	require.Contains(t, errOut, `"no-such-topic-`+c.schema+`.poison" does not exist on NATS`)
	// The AMQP password never shows.
	code, _, errOut = c.run("dlq", "list", "--topic", "x", "--broker", "amqp", "--amqp-url", "amqp://guest:s3cr3t-pw@127.0.0.1:1/")
	require.Equal(t, exitFail, code)
	require.NotContains(t, errOut, "s3cr3t-pw")
	require.Contains(t, errOut, "connect to RabbitMQ")
}

// `claimtx dlq list` marks a repeated copy of one message (poisoned again
// after a crash before its ack) with the position of the first, and a
// replay sends the message once.
func TestCLIDLQRepeatedCopies(t *testing.T) {
	dlqtest.EachBroker(t, 1, func(t *testing.T, w *dlqtest.World) {
		c, broker := dlqCLI(t, w)
		reason := errors.New("cannot decode")
		copies := w.Poisoned("loyalty", dlqKeySpec, reason, dlqtest.Orders(1, 2)...)
		w.Publish(w.Poison, append(copies, w.Poisoned("loyalty", dlqKeySpec, reason, dlqtest.Order(1))...)...)
		args := func(a ...string) []string {
			return append(append([]string{"dlq"}, a...), append(broker, "--consumer", "loyalty", "--key-spec", dlqKeySpec)...)
		}

		rows := jsonLines(t, c.ok(args("list", "--json")...))
		require.Len(t, rows, 3)
		require.Nil(t, rows[0]["copy_of"])
		require.Equal(t, rows[0]["position"], rows[2]["copy_of"], "the second copy of order 1")
		out := c.ok(args("list")...)
		require.Contains(t, out, fmt.Sprintf("copy of %s", rows[0]["position"]))
		require.Contains(t, out, "would apply       2")
		require.Contains(t, out, "repeated copies   1")

		require.Contains(t, c.ok(args("replay", "--dry-run")...), "dry run: 2 would be replayed to "+w.Topic)
		require.Contains(t, c.ok(args("replay")...), "2 replayed to "+w.Topic)
		var ids []string
		for _, m := range w.Read(w.Topic) {
			ids = append(ids, m.UUID)
		}
		require.ElementsMatch(t, []string{"order-1", "order-2"}, ids)
	})
}
