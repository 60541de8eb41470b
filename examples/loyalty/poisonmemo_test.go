package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/internal/pg"
	"github.com/claimtx/claimtx/store"
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
					m, ok, err := pg.MemosOf(h.pool, pg.NewNames(h.schema, "processed_messages", "outbox")).Get(context.Background(), "loyalty", "order-completed:1")
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

				n, err := pg.MemosOf(h.pool, pg.NewNames(h.schema, "processed_messages", "outbox")).Clear(context.Background(), pg.MemoFilter{Consumer: "loyalty"})
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

// TestLeastPrivilegePoisonMemo: POISON_MEMO needs SELECT, INSERT, UPDATE on
// the memo table for the consumer role; without them the consumer refuses
// to start, naming the variable and the grant, instead of failing every
// claim. The cleanup role without rights on the memo table still cleans
// claims (and leaves memos alone); granted SELECT, DELETE, it removes the
// expired memos too.
func TestLeastPrivilegePoisonMemo(t *testing.T) {
	t.Parallel()
	h := newHarness(t, "amqp")
	ctx := context.Background()
	schema := pgx.Identifier{h.schema}.Sanitize()
	memo := schema + "." + pgx.Identifier{"processed_messages_poison_memo"}.Sanitize()
	w := newOwnedWorld(t, h)
	consumerRole, cleanupRole, consumerURL, cleanupURL := w.consumerRole, w.cleanupRole, w.consumerURL, w.cleanupURL
	_, err := h.pool.Exec(ctx, fmt.Sprintf(`
GRANT USAGE ON SCHEMA %[1]s TO %[2]s, %[3]s;
GRANT SELECT, INSERT ON %[1]s.processed_messages TO %[2]s;
GRANT SELECT ON %[1]s.claimtx_migration TO %[2]s;
GRANT SELECT, INSERT, UPDATE ON %[1]s.balances, %[1]s.point_ledger TO %[2]s;
GRANT SELECT, DELETE ON %[1]s.processed_messages TO %[3]s;
GRANT SELECT, INSERT, UPDATE, DELETE ON %[1]s.claimtx_lease TO %[3]s;`, schema, consumerRole, cleanupRole))
	require.NoError(t, err)

	p := h.start("DATABASE_URL="+consumerURL, "POISON_MEMO=true", "STARTUP_TIMEOUT=-1s")
	require.True(t, p.exited(30*time.Second), "the consumer must refuse to start")
	require.Contains(t, p.out.String(), "POISON_MEMO")
	require.Contains(t, p.out.String(), "lacks SELECT, INSERT, UPDATE on "+h.schema+".processed_messages_poison_memo")

	_, err = h.pool.Exec(ctx, fmt.Sprintf("GRANT SELECT, INSERT, UPDATE ON %s TO %s", memo, consumerRole))
	require.NoError(t, err)
	h.start("DATABASE_URL="+consumerURL, "POISON_MEMO=true")
	bad := order{OrderID: 1, CustomerID: 7, TotalCents: -1}
	h.publish(bad)
	h.poisoned(1)
	h.waitFor("memo", func() bool { return h.tryCount("SELECT count(*) FROM "+memo) == 1 })
	h.publish(bad)
	require.Contains(t, h.poisoned(1)[0].headers["claimtx_poison_reason"], "poison memo:")
	// The consumer stamps the memo (seen + 1, poisoned_at = now()) after
	// the copy reached the poison queue: back-dating it before that stamp
	// would be undone by it.
	h.waitFor("second poisoning recorded", func() bool { return h.tryCount("SELECT seen FROM "+memo) == 2 })

	// Retention under the cleanup role.
	_, err = h.pool.Exec(ctx, "UPDATE "+memo+" SET poisoned_at = now() - interval '1 day'")
	require.NoError(t, err)
	clean, err := store.New(rolePool(t, cleanupURL), store.Config{Schema: h.schema})
	require.NoError(t, err)
	res, err := clean.Cleanup(ctx, store.RetentionConfig{Retention: time.Hour, Force: true, Pause: -1})
	require.NoError(t, err, "no rights on the memo table: memos are left alone")
	require.Zero(t, res.Memos)
	require.Equal(t, 1, h.count("SELECT count(*) FROM "+memo))
	_, err = h.pool.Exec(ctx, fmt.Sprintf("GRANT SELECT, DELETE ON %s TO %s", memo, cleanupRole))
	require.NoError(t, err)
	res, err = clean.Cleanup(ctx, store.RetentionConfig{Retention: time.Hour, Force: true, Pause: -1})
	require.NoError(t, err)
	require.EqualValues(t, 1, res.Memos)
	require.Zero(t, h.count("SELECT count(*) FROM "+memo))
}
