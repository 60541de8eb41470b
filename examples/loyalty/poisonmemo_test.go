package main

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/internal/poisonmemo"
	"github.com/claimtx/claimtx/internal/sqlnames"
)

// TestPoisonMemoEnv runs the consumer with POISON_MEMO=true, as an operator
// would, on both brokers, per message and in batches: a bad order is
// poisoned by its handler, its next copy by the memo; unpoisoned, the next
// copy reaches the handler again.
func TestPoisonMemoEnv(t *testing.T) {
	t.Parallel()
	for _, kind := range []string{"amqp", "kafka"} {
		for _, batch := range []string{"0", "8"} {
			t.Run(kind+"/batch="+batch, func(t *testing.T) {
				t.Parallel()
				h := newHarness(t, kind)
				h.start("POISON_MEMO=true", "BATCH_SIZE="+batch)
				reasons := func(n int) []string {
					t.Helper()
					var out []string
					for _, m := range h.poisoned(n) {
						out = append(out, m.headers["claimtx_poison_reason"])
					}
					return out
				}
				memoReason := func() string {
					t.Helper()
					m, ok, err := poisonmemo.Get(context.Background(), h.pool, sqlnames.New(h.schema, "processed_messages", "outbox"), "loyalty", "order-completed:1")
					require.NoError(t, err)
					if !ok {
						return ""
					}
					return m.Reason
				}
				bad := order{OrderID: 1, CustomerID: 7, TotalCents: -100}
				h.publish(bad)
				require.Contains(t, strings.Join(reasons(1), "|"), "total_cents is negative")
				h.waitFor("memo recorded", func() bool { return strings.Contains(memoReason(), "total_cents is negative") })

				h.publish(bad, order{OrderID: 2, CustomerID: 8, TotalCents: 300})
				got := reasons(map[string]int{"amqp": 1, "kafka": 2}[kind])
				require.Contains(t, got[len(got)-1], "poison memo: loyalty: bad OrderCompleted event: total_cents is negative")
				h.waitApplied(1)

				n, err := poisonmemo.ClearWhere(context.Background(), h.pool, sqlnames.New(h.schema, "processed_messages", "outbox"), poisonmemo.Filter{Consumer: "loyalty"})
				require.NoError(t, err)
				require.EqualValues(t, 1, n)
				h.publish(bad)
				got = reasons(map[string]int{"amqp": 1, "kafka": 3}[kind])
				require.NotContains(t, got[len(got)-1], "poison memo", "after unpoison the handler runs (and refuses the order again): %v", got)
				require.Equal(t, 1, h.count(fmt.Sprintf("SELECT count(*) FROM %q.processed_messages", h.schema)), "claims: order 2 only")
			})
		}
	}
}
