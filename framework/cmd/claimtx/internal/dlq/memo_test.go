package dlq_test

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/framework/cmd/claimtx/internal/dlq"
	"github.com/claimtx/claimtx/framework/cmd/claimtx/internal/dlq/dlqtest"
	"github.com/claimtx/claimtx/internal/pg"
)

// A dead letter whose key has a poison memo is reported as such, and a
// replay clears the memo before republishing it: otherwise the copy would
// go straight back to the poison destination without reaching the handler.
func TestReplayClearsPoisonMemo(t *testing.T) {
	dlqtest.EachBroker(t, 1, func(t *testing.T, w *dlqtest.World) {
		ctx := context.Background()
		reason := framework.Permanent(errors.New("customer unknown before the fix"))
		w.Publish(w.Poison, w.Poisoned(consumer, keySpec, reason, dlqtest.Order(1), dlqtest.Order(2))...)
		names := pg.NewNames(w.Schema, "processed_messages", "outbox")
		require.NoError(t, pg.MemosOf(w.Pool, names).Record(ctx, consumer, "order:1", reason))
		memo, err := dlq.MemoOf(ctx, w.Pool, names)
		require.NoError(t, err)

		run := func(dry bool) (dlq.Totals, map[string]dlq.Class) {
			cls := classifier(t, w.Pool, w.Schema)
			cls.Memo = memo
			got := map[string]dlq.Class{}
			r := dlq.Run{Source: open(t, w, true), Classifier: cls, Topic: w.Topic,
				Filter: dlq.Filter{Consumer: consumer, Topic: w.Topic}, DryRun: dry, BatchSize: 4,
				OnLetter: func(l *dlq.Letter) error { got[l.Msg.UUID] = l.Class; return nil }}
			tot, err := r.Replay(ctx)
			require.NoError(t, err)
			require.NoError(t, r.Source.Close())
			return tot, got
		}

		_, got := run(true)
		require.Equal(t, map[string]dlq.Class{"order-1": dlq.ClassMemo, "order-2": dlq.ClassWouldApply}, got)
		_, ok, err := pg.MemosOf(w.Pool, names).Get(ctx, consumer, "order:1")
		require.NoError(t, err)
		require.True(t, ok, "a dry run keeps the memo")

		tot, _ := run(false)
		require.EqualValues(t, 2, tot.Replayed)
		require.ElementsMatch(t, []string{"order-1", "order-2"}, uuids(w.Read(w.Topic)))
		_, ok, err = pg.MemosOf(w.Pool, names).Get(ctx, consumer, "order:1")
		require.NoError(t, err)
		require.False(t, ok, "the replay cleared the memo of what it republished")
	})
}
