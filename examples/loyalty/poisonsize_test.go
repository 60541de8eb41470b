package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/claimtx/claimtx/examples/loyalty/feed"
)

// Issue 26 part 3: a poison copy the broker refuses must not be redelivered
// forever. The key (KEY=metadata:event_id) is fine, decoding is not: the
// order_id is a number of tens of thousands of digits, and Go's JSON error
// quotes the whole number. Before the fix the poison middleware put that
// text in two headers; JetStream refused the copy (header size over 64k),
// RabbitMQ closed the publisher's connection (FRAME_ERROR, the headers
// over the frame size), Kafka's producer refused it (message over 1 MiB),
// the original was nacked and came back, forever, with an ERROR line of the
// whole reason each time.

// poisonReasonLimit is the documented bound of a poisoned copy's reason
// (middleware.Poison): 4 KiB.
const poisonReasonLimit = 4096

// hugeOrder is an OrderCompleted whose order_id is a number of digits
// digits: valid JSON, keyed by its event_id, that json.Unmarshal refuses
// (it overflows an int64) with an error quoting the whole number.
func hugeOrder(digits int) []byte {
	return []byte(`{"order_id": ` + strings.Repeat("9", digits) + `, "customer_id": 1, "total_cents": 100}`)
}

// hugeOrderOfSize is hugeOrder of exactly size bytes.
func hugeOrderOfSize(size int) []byte {
	return hugeOrder(size - len(hugeOrder(0)))
}

var sizeModes = []struct {
	name string
	env  []string
}{
	{"per-message", nil},
	{"batch", []string{"BATCH_SIZE=64", "BATCH_WORKERS=2"}},
}

// TestOversizedPoisonReasonIsBounded: the messages on each broker,
// per message and in batches (the example's defaults otherwise, KEY as in
// the report). The message ends in TOPIC.poison, once, with its payload and
// a reason bounded to 4 KiB that says it was truncated; the original is
// acked; good orders around it are applied; nothing comes back; and the
// whole reason is logged once, not once per redelivery.
func TestOversizedPoisonReasonIsBounded(t *testing.T) {
	t.Parallel()
	cases := []struct {
		kind   string
		digits int
	}{
		{"nats", 40_000},   // two 40 kB headers: over JetStream's 64k header limit
		{"amqp", 150_000},  // 300 kB of headers: over RabbitMQ's 128 KiB frame
		{"kafka", 400_000}, // 400 kB payload + 800 kB headers: over 1 MiB
	}
	for _, c := range cases {
		for _, mode := range sizeModes {
			t.Run(c.kind+"/"+mode.name, func(t *testing.T) {
				t.Parallel()
				h := newHarness(t, c.kind)
				p := h.start(append([]string{"KEY=metadata:event_id"}, mode.env...)...)
				payload := hugeOrder(c.digits)
				good := orders(1, 10)
				h.publish(good[:5]...)
				h.publishRaw([]string{"huge"}, [][]byte{payload})
				h.publish(good[5:]...)

				h.waitApplied(len(good))
				h.requirePoisonSettled(t, p, 1)
				ps := h.readPoisonFully(t)
				require.Len(t, ps, 1, "one poisoned copy, not one per redelivery")
				m := ps[0]
				require.Equal(t, "huge", m.headers["event_id"])
				require.Equal(t, string(payload), string(m.body), "the original payload is kept")
				for _, key := range []string{"claimtx_poison_reason", "reason_poisoned"} {
					requireBoundedReason(t, m.headers[key], "cannot unmarshal number")
				}
				require.Equal(t, 0, h.deadLetterRows(t), "the copy fitted: nothing in the dead-letter table")
				h.assertExact(good)

				out := p.out.String()
				require.LessOrEqual(t, strings.Count(out, strings.Repeat("9", c.digits)), 1,
					"the whole reason is logged once at most")
				requireNoRepeatedLongLines(t, out)
			})
		}
	}
}

// TestPoisonCopyOverBrokerLimit: messages the broker took whose poisoned
// copy it still refuses once the reason is bounded. Near the limit the
// copy's bookkeeping is what does not fit: a smaller copy (shorter reason)
// is published. Over it, or when the poison destination is missing
// (NATS_STREAMS=require), nothing the broker would take exists: the
// message is recorded in Postgres (claimtx.processed_messages_dead_letter)
// with its payload, headers, reason and the broker's error, the original
// is acked, the broker's error is logged at ERROR once, and it is counted
// in claimtx_poison_refused_total. Nothing comes back in either case.
func TestPoisonCopyOverBrokerLimit(t *testing.T) {
	t.Parallel()
	const (
		natsMax  = 1 << 20 // the server's max_payload
		kafkaMax = 1 << 20 // Sarama's Producer.MaxMessageBytes (kfake: 1 MiB + 12)
		amqpMax  = 131072  // RabbitMQ's frame_max: one frame holds every header
		// near leaves room for the original's headers and a smaller
		// copy's bookkeeping (about 1 KB), not for a 4 KiB reason twice;
		// over leaves room for the original's headers only.
		near, over = 4000, 300
	)
	type sizeCase struct {
		name     string
		kind     string
		env      []string
		payload  []byte
		header   int // bytes of an extra "blob" header (AMQP)
		fallback string
	}
	cases := []sizeCase{
		{name: "nats/near", kind: "nats", payload: hugeOrderOfSize(natsMax - near), fallback: "smaller_copy"},
		{name: "nats/over", kind: "nats", payload: hugeOrderOfSize(natsMax - over), fallback: "dead_letter_table"},
		{name: "nats/missing-stream", kind: "nats", env: []string{"NATS_STREAMS=require"}, payload: hugeOrder(20_000), fallback: "dead_letter_table"},
		// The body is not in the header frame: the headers make the size.
		{name: "amqp/near", kind: "amqp", payload: hugeOrder(20_000), header: amqpMax - 1000 - near, fallback: "smaller_copy"},
		{name: "amqp/over", kind: "amqp", payload: hugeOrder(20_000), header: amqpMax - 1000 + 700, fallback: "dead_letter_table"},
		{name: "kafka/near", kind: "kafka", payload: hugeOrderOfSize(kafkaMax - near), fallback: "smaller_copy"},
		{name: "kafka/over", kind: "kafka", payload: hugeOrderOfSize(kafkaMax - over), fallback: "dead_letter_table"},
	}
	// Batches too, for the cases that end in the database.
	base := cases
	for _, c := range base {
		if c.fallback == "dead_letter_table" {
			c.name += "/batch"
			c.env = append(append([]string(nil), c.env...), sizeModes[1].env...)
			cases = append(cases, c)
		}
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, c.kind)
			p := h.start(append([]string{"KEY=metadata:event_id"}, c.env...)...)
			good := orders(1, 6)
			h.publish(good[:3]...)
			h.publishBig(t, "big", c.payload, c.header)
			h.publish(good[3:]...)
			h.waitApplied(len(good))

			switch c.fallback {
			case "smaller_copy":
				h.requirePoisonSettled(t, p, 1)
				ps := h.readPoisonFully(t)
				require.Len(t, ps, 1)
				require.Equal(t, "big", ps[0].headers["event_id"])
				require.Equal(t, string(c.payload), string(ps[0].body))
				requireBoundedReason(t, ps[0].headers["claimtx_poison_reason"], "cannot unmarshal number")
				require.Less(t, len(ps[0].headers["claimtx_poison_reason"]), 1024, "the smaller copy's reason is shorter")
				require.Equal(t, 0, h.deadLetterRows(t))
			case "dead_letter_table":
				h.requirePoisonSettled(t, p, 0)
				require.Equal(t, 0, h.poisonCount(t), "nothing reached the poison destination")
				require.Equal(t, 1, h.deadLetterRows(t), "one dead-letter row, not one per redelivery")
				var consumer, key, reason, publishErr, topic, poisonTopic, eventID string
				var body []byte
				require.NoError(t, h.pool.QueryRow(context.Background(), fmt.Sprintf(
					`SELECT consumer, message_key, reason, publish_error, topic, poison_topic, payload, metadata->>'event_id'
					 FROM %q.processed_messages_dead_letter`, h.schema)).
					Scan(&consumer, &key, &reason, &publishErr, &topic, &poisonTopic, &body, &eventID))
				require.Equal(t, "loyalty", consumer)
				require.Equal(t, "big", key)
				require.Equal(t, "big", eventID, "the headers are kept")
				require.Equal(t, h.topic, topic)
				require.Equal(t, h.topic+".poison", poisonTopic)
				require.Equal(t, string(c.payload), string(body), "the payload is kept")
				requireBoundedReason(t, reason, "")
				require.NotEmpty(t, publishErr, "the broker's error is kept")
				out := p.out.String()
				require.Equal(t, 1, countLines(out, "level=ERROR", "refused the poisoned copy"),
					"the broker's refusal is logged at ERROR once:\n%s", tail(out))
			}
			require.Equal(t, 1, p.metric(t, "claimtx_poison_refused_total", `fallback="`+c.fallback+`"`))
			h.assertExact(good)
			requireNoRepeatedLongLines(t, p.out.String())
		})
	}
}

// requirePoisonSettled waits until the bad message is settled: copies
// poisoned copies in the poison destination, the original acked (nothing
// of the topic unsettled), the consumer's claimtx_messages_total at one
// poisoned and no failed; then waits 3 s more and checks that it stays so
// (no redelivery loop).
func (h *harness) requirePoisonSettled(t *testing.T, p *proc, copies int) {
	t.Helper()
	settled := func() bool {
		o := p.outcomes(t)
		return h.poisonCount(t) >= copies && h.unsettledAll(t) == 0 && o["poisoned"] == 1
	}
	if !waitUntil(45*time.Second, settled) {
		o := p.outcomes(t)
		require.Failf(t, "not settled within 45s", "%d poisoned copies (want %d), %d unsettled, outcomes %v; output:\n%s",
			h.poisonCount(t), copies, h.unsettledAll(t), o, tail(p.out.String()))
	}
	time.Sleep(3 * time.Second)
	o := p.outcomes(t)
	require.Equal(t, 1, o["poisoned"], "poisoned once: %v", o)
	require.Zero(t, o["failed"], "never nacked: %v", o)
	require.Equal(t, copies, h.poisonCount(t), "no further copies")
	require.Zero(t, h.unsettledAll(t))
}

// unsettledAll is unsettled, with RabbitMQ's unacked messages counted too.
func (h *harness) unsettledAll(t *testing.T) int {
	t.Helper()
	if h.kind == "amqp" {
		ready, unacked := queueStats(t, h.topic)
		return ready + unacked
	}
	return h.unsettled(t)
}

// deadLetterRows counts the rows of the dead-letter table (-1 while it
// does not exist).
func (h *harness) deadLetterRows(t *testing.T) int {
	t.Helper()
	return h.tryCount(fmt.Sprintf(`SELECT count(*) FROM %q.processed_messages_dead_letter`, h.schema))
}

// publishBig publishes one message as a plain producer, like publishRaw,
// with clients that take messages up to the broker's limit, and on AMQP
// an extra header of blob bytes.
func (h *harness) publishBig(t *testing.T, eventID string, payload []byte, blob int) {
	t.Helper()
	ctx := context.Background()
	switch h.kind {
	case "kafka":
		// franz-go's producer stops at 1,000,012 bytes a batch by default.
		cl, err := kgo.NewClient(kgo.SeedBrokers(h.kafkaAddr), kgo.ProducerLinger(0), kgo.ProducerBatchMaxBytes(2<<20))
		require.NoError(t, err)
		defer cl.Close()
		require.NoError(t, cl.ProduceSync(ctx, feed.KafkaRecord(h.topic, eventID, payload)).FirstErr())
	case "amqp":
		ch, err := h.amqp().Channel()
		require.NoError(t, err)
		defer func() { _ = ch.Close() }()
		require.NoError(t, ch.Confirm(false))
		headers := amqp.Table{"event_id": eventID}
		if blob > 0 {
			headers["blob"] = strings.Repeat("b", blob)
		}
		conf, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", h.topic, false, false, amqp.Publishing{
			DeliveryMode: amqp.Persistent, MessageId: randID(), Body: payload, Headers: headers,
		})
		require.NoError(t, err)
		ok, err := conf.WaitContext(ctx)
		require.NoError(t, err)
		require.True(t, ok, "RabbitMQ took the original")
	default:
		h.publishRaw([]string{eventID}, [][]byte{payload})
	}
}

// requireBoundedReason checks a reason the way an operator reads it: at
// most 4 KiB, valid UTF-8, and, when it had to be cut, saying so with the
// length and a hash of the whole text.
func requireBoundedReason(t *testing.T, reason, contains string) {
	t.Helper()
	require.NotEmpty(t, reason)
	require.LessOrEqual(t, len(reason), poisonReasonLimit, "reason of %d bytes", len(reason))
	require.True(t, utf8.ValidString(reason), "the reason is valid UTF-8")
	require.Contains(t, reason, contains)
	require.Contains(t, reason, "truncated")
	require.Contains(t, reason, "sha256:")
}

// requireNoRepeatedLongLines fails when more than one log line is longer
// than 8 KiB: the whole reason may be logged once, never again per
// redelivery or retry.
func requireNoRepeatedLongLines(t *testing.T, out string) {
	t.Helper()
	n := 0
	for _, line := range strings.Split(out, "\n") {
		if len(line) > 8<<10 {
			n++
		}
	}
	require.LessOrEqual(t, n, 1, "log lines over 8 KiB")
}

// countLines counts the lines of out containing every one of subs.
func countLines(out string, subs ...string) int {
	n := 0
lines:
	for _, line := range strings.Split(out, "\n") {
		for _, s := range subs {
			if !strings.Contains(line, s) {
				continue lines
			}
		}
		n++
	}
	return n
}

// tail is the end of a process's output, each line cut to 300 bytes, for
// failure messages that stay readable when lines are huge.
func tail(out string) string {
	lines := strings.Split(out, "\n")
	if len(lines) > 40 {
		lines = lines[len(lines)-40:]
	}
	for i, l := range lines {
		if len(l) > 300 {
			lines[i] = l[:300] + fmt.Sprintf("… (%d bytes)", len(l))
		}
	}
	return strings.Join(lines, "\n")
}

// metric scrapes the consumer's /metrics and sums the series of name whose
// labels contain label ("" for all).
func (p *proc) metric(t *testing.T, name, label string) int {
	t.Helper()
	resp, err := http.Get(p.metricsURL(t))
	require.NoError(t, err)
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	sum := 0
	for _, line := range strings.Split(string(body), "\n") {
		if !strings.HasPrefix(line, name+"{") && !strings.HasPrefix(line, name+" ") {
			continue
		}
		if label != "" && !strings.Contains(line, label) {
			continue
		}
		v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		require.NoError(t, err, "metric line %q", line)
		sum += int(v)
	}
	return sum
}
