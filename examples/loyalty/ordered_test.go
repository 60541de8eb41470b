package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/claimtx/claimtx/framework/cmd/claimtx/claimtxcli"
)

// orderKey keys the loyalty consumer's order by customer.
const orderKey = "ORDER_KEY=template:customer-{payload.customer_id}"

// publishByCustomer publishes orders as a producer of ordered events
// does: on Kafka each customer's orders share a partition (record key =
// customer), on RabbitMQ one queue keeps them in order.
func (h *harness) publishByCustomer(orders ...order) {
	h.t.Helper()
	if h.kind != "kafka" {
		h.publish(orders...)
		return
	}
	recs := make([]*kgo.Record, len(orders))
	for i, o := range orders {
		b, err := json.Marshal(o)
		require.NoError(h.t, err)
		id := fmt.Sprintf("evt-%d", o.OrderID)
		recs[i] = &kgo.Record{Topic: h.topic, Key: []byte(strconv.FormatInt(o.CustomerID, 10)), Value: b,
			Headers: []kgo.RecordHeader{{Key: "event_id", Value: []byte(id)}}}
	}
	require.NoError(h.t, h.kcl.ProduceSync(context.Background(), recs...).FirstErr())
}

// ids returns the int64 column of sql's rows.
func (h *harness) ids(sql string, args ...any) []int64 {
	h.t.Helper()
	rows, err := h.pool.Query(context.Background(), sql, args...)
	require.NoError(h.t, err)
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	require.NoError(h.t, err)
	return ids
}

// credited is the order ids of customer, in the order they were credited.
func (h *harness) credited(customer int64) []int64 {
	return h.ids("SELECT order_id FROM point_ledger WHERE customer_id = $1 ORDER BY applied_seq", customer)
}

// parkedOrders is the order ids parked under customer's order key, in order.
func (h *harness) parkedOrders(customer int64) []int64 {
	return h.ids("SELECT (convert_from(payload, 'UTF8')::jsonb->>'order_id')::bigint FROM processed_messages_parked WHERE order_key = $1 ORDER BY id",
		fmt.Sprintf("customer-%d", customer))
}

// parked runs `claimtx parked args…` on the harness's schema, as an
// operator would, and requires it to succeed.
func (h *harness) parked(args ...string) string {
	h.t.Helper()
	var out, errOut bytes.Buffer
	code := claimtxcli.Run(context.Background(), claimtxcli.Config{},
		append([]string{"parked"}, append(args, "--database-url", h.dbURL, "--schema", h.schema)...), &out, &errOut)
	require.Equal(h.t, 0, code, "claimtx parked %v: %s%s", args, out.String(), errOut.String())
	return out.String()
}

// ordersOf is customer's orders first..last (order id = its number).
func ordersOf(customer, first, last int64) []order {
	var os []order
	for id := first; id <= last; id++ {
		os = append(os, order{OrderID: id, CustomerID: customer, TotalCents: 100 * id})
	}
	return os
}

func interleave(lists ...[]order) []order {
	var out []order
	for i := 0; ; i++ {
		added := false
		for _, l := range lists {
			if i < len(l) {
				out, added = append(out, l[i]), true
			}
		}
		if !added {
			return out
		}
	}
}

var orderedModes = []struct {
	name string
	env  []string
}{{"per-message", nil}, {"batch", []string{"BATCH_SIZE=8"}}}

// TestOrderedParkThenRetry: customer 7's order 2 is refused for good:
// it and 3..5 park in order, customer 8 is credited; the handler fixed
// (restarted without the fault), `claimtx parked retry` credits 2..5 in
// order, exactly once, and copies with fresh transport ids stay duplicates.
func TestOrderedParkThenRetry(t *testing.T) {
	t.Parallel()
	for _, kind := range []string{"amqp", "kafka"} {
		for _, mode := range orderedModes {
			t.Run(kind+"/"+mode.name, func(t *testing.T) {
				t.Parallel()
				h := newHarness(t, kind)
				env := append([]string{orderKey, "CONCURRENCY=1"}, mode.env...)
				p := h.start(append(env, "LOYALTY_REJECT_ORDERS=2")...)
				k, other := ordersOf(7, 1, 5), ordersOf(8, 11, 15)
				h.publishByCustomer(interleave(k, other)...)
				h.waitFor("2..5 parked, customer 8 credited", func() bool {
					return h.tryCount("SELECT count(*) FROM processed_messages_parked") == 4 && h.tryCount("SELECT count(*) FROM point_ledger") == 6
				})
				require.Equal(t, []int64{1}, h.credited(7))
				require.Equal(t, []int64{2, 3, 4, 5}, h.parkedOrders(7))
				require.Equal(t, []int64{11, 12, 13, 14, 15}, h.credited(8))
				require.Contains(t, h.parked("list", "--consumer", "loyalty"), "customer-7")

				p.stop()
				h.start(env...)
				require.Contains(t, h.parked("retry", "--consumer", "loyalty", "--key", "customer-7"), "requested a retry of 1")
				h.waitFor("released", func() bool { return h.tryCount("SELECT count(*) FROM processed_messages_parked_keys") == 0 })
				require.Equal(t, []int64{1, 2, 3, 4, 5}, h.credited(7))
				h.publishByCustomer(k[1], k[3], other[0]) // copies: fresh transport ids
				h.publishByCustomer(ordersOf(7, 6, 6)...)
				h.waitApplied(11)
				require.Equal(t, []int64{1, 2, 3, 4, 5, 6}, h.credited(7))
				h.assertExact(append(append(k, other...), ordersOf(7, 6, 6)...))
				require.Zero(t, h.poisonCount(t), "parked, not poisoned")
			})
		}
	}
}

// TestOrderedSkip: `claimtx parked skip` sends the head to the poison
// destination with the operator's note and credits the rest in order.
func TestOrderedSkip(t *testing.T) {
	t.Parallel()
	for _, kind := range []string{"amqp", "kafka"} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, kind)
			h.start(orderKey, "CONCURRENCY=1", "LOYALTY_REJECT_ORDERS=2")
			h.publishByCustomer(ordersOf(7, 1, 5)...)
			h.waitFor("2..5 parked", func() bool { return h.tryCount("SELECT count(*) FROM processed_messages_parked") == 4 })
			h.parked("skip", "--consumer", "loyalty", "--all", "--note", "order 2 was cancelled", "--by", "ops")
			h.waitFor("released", func() bool { return h.tryCount("SELECT count(*) FROM processed_messages_parked_keys") == 0 })
			require.Equal(t, []int64{1, 3, 4, 5}, h.credited(7))
			m := h.poisoned(1)[0]
			require.Contains(t, string(m.body), `"order_id":2`)
			require.Contains(t, m.headers["claimtx_poison_reason"], `skipped by "ops" (order 2 was cancelled)`)
			require.Contains(t, m.headers["claimtx_poison_reason"], "LOYALTY_REJECT_ORDERS")
		})
	}
}

// TestOrderedSurvivesSIGKILL: killed while a key's orders park behind its
// head, and again while a release credits them, then restarted: every order
// is credited once, in order, and nothing stays parked.
func TestOrderedSurvivesSIGKILL(t *testing.T) {
	t.Parallel()
	for _, kind := range []string{"amqp", "kafka"} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, kind)
			env := []string{orderKey, "CONCURRENCY=1"}
			p := h.start(append(env, "LOYALTY_REJECT_ORDERS=2")...)
			k := ordersOf(7, 1, 60)
			h.publishByCustomer(k...)
			h.waitFor("parking under way", func() bool { return h.tryCount("SELECT count(*) FROM processed_messages_parked") >= 10 })
			p.kill()
			p = h.start(append(env, "LOYALTY_REJECT_ORDERS=2")...)
			h.waitFor("2..60 parked", func() bool { return h.tryCount("SELECT count(*) FROM processed_messages_parked") == 59 })
			want := make([]int64, 0, 60)
			for _, o := range k {
				want = append(want, o.OrderID)
			}
			require.Equal(t, want[1:], h.parkedOrders(7), "parked once each, in order")
			p.stop()

			// Slow credits, so the kill lands mid-release.
			p = h.start(append(env, "LOYALTY_HANDLER_DELAY=20ms")...)
			h.parked("retry", "--consumer", "loyalty", "--key", "customer-7")
			h.waitFor("release under way", func() bool { return h.tryCount("SELECT count(*) FROM point_ledger") >= 15 })
			p.kill()
			require.Less(t, len(h.credited(7)), 60, "killed mid-release")
			p = h.start(env...)
			h.waitFor("released", func() bool { return h.tryCount("SELECT count(*) FROM processed_messages_parked_keys") == 0 })
			require.Equal(t, want, h.credited(7))
			h.assertExact(k)
			p.stop()
			// Work a kill interrupted is redone, never poisoned; and the
			// parked copies' deliveries were all acked.
			require.Zero(t, h.poisonCount(t), "nothing reached the poison destination")
			h.requireDrained(t)
		})
	}
}
