package keycheck_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/framework/cmd/claimtx/internal/keycheck"
)

func msg(id, payload string, md map[string]string) *message.Message {
	m := message.NewMessage(id, []byte(payload))
	for k, v := range md {
		m.Metadata.Set(k, v)
	}
	return m
}

// The report finds what makes a key spec unsafe: keys shared by different
// payloads, one payload under several keys, messages without a key; and
// describes the keys and event times.
func TestChecker(t *testing.T) {
	t.Parallel()
	key, err := framework.ParseKeySpec("template:{metadata.tenant}:{payload.order_id}")
	require.NoError(t, err)
	at, err := framework.ParseTimeSpec("metadata:event_time")
	require.NoError(t, err)
	c := &keycheck.Checker{Key: key, EventTime: at, Examples: 2}
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	ts := func(h int) string { return t0.Add(time.Duration(h) * time.Hour).Format(time.RFC3339) }
	for i := 1; i <= 5; i++ {
		c.Add(msg(fmt.Sprint("m", i), fmt.Sprintf(`{"order_id": %d}`, i), map[string]string{"tenant": "a", "event_time": ts(i)}))
	}
	c.Add(msg("dup", `{"order_id": 1}`, map[string]string{"tenant": "a", "event_time": ts(1)}))            // a redelivery
	c.Add(msg("clash", `{"order_id": 2, "x": 1}`, map[string]string{"tenant": "a", "event_time": ts(30)})) // collides with m2
	c.Add(msg("other-tenant", `{"order_id": 3}`, map[string]string{"tenant": "b"}))                        // same payload as m3, another key
	c.Add(msg("nokey-1", `{"id": 9}`, map[string]string{"tenant": "a"}))
	c.Add(msg("nokey-2", `{"id": 10}`, map[string]string{"tenant": "a"}))
	c.Add(msg("nokey-3", `{"id": 11}`, map[string]string{"tenant": "a"}))
	c.Add(msg("notenant", `{"order_id": 4}`, nil))

	r := c.Report()
	require.Equal(t, 12, r.Messages)
	require.Equal(t, 8, r.Keyed)
	require.Equal(t, 6, r.Keys)
	require.Equal(t, 1, r.Duplicates)
	require.Len(t, r.Collisions, 1)
	require.Equal(t, "a:2", r.Collisions[0].Key)
	require.Equal(t, 2, r.Collisions[0].Messages)
	require.Len(t, r.Collisions[0].Payloads, 2)
	require.Len(t, r.Volatile, 1)
	require.Equal(t, []string{"a:3", "b:3"}, r.Volatile[0].Keys)
	require.Len(t, r.Unkeyable, 2)
	require.Equal(t, 3, r.Unkeyable[0].Messages, "most frequent first")
	require.Len(t, r.Unkeyable[0].IDs, 2, "examples capped")
	require.Contains(t, r.Unkeyable[0].Reason, "order_id")
	require.Contains(t, r.Unkeyable[1].Reason, "tenant")
	require.Equal(t, keycheck.Quantiles{Min: 3, P50: 3, P90: 3, P99: 3, Max: 3}, *r.KeyLength)
	require.Equal(t, 7, r.EventTime.With)
	require.Equal(t, t0.Add(time.Hour), r.EventTime.Earliest)
	require.Equal(t, t0.Add(30*time.Hour), r.EventTime.Latest)
	require.Equal(t, "29h0m0s", r.EventTime.Spread)
	n := 0
	for _, k := range r.EventTime.Without {
		n += k
	}
	require.Equal(t, 5, n)

	// A key function that panics is a finding, not a crash.
	p := &keycheck.Checker{Key: func(*message.Message) (string, error) { panic("boom") }}
	p.Add(msg("x", "{}", nil))
	require.Contains(t, p.Report().Unkeyable[0].Reason, "panicked")
}
