package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/claimtx/claimtx/internal/testenv"
	"github.com/claimtx/claimtx/store"
)

// Kafka positions stored with the claims (docs/design.md, "Kafka
// positions"): each claim transaction raises its partition's settled
// position, and a partition starts at max(group offset, stored position).
// These tests run the consumer as its own process, per message and in
// batches of 64, and judge from the database and /metrics.

// positionModes are the consumer modes the tests run in.
var positionModes = []struct {
	name string
	env  []string
}{
	{"per-message", nil},
	{"batch", []string{"BATCH_SIZE=64"}},
}

const skippedMetric = "claimtx_kafka_positions_skipped_total"

// metricSum sums the samples of a metric on the consumer's /metrics.
func (p *proc) metricSum(t *testing.T, name string) int {
	t.Helper()
	sum := 0
	for _, line := range strings.Split(scrape(t, p.metricsURL(t)), "\n") {
		if !strings.HasPrefix(line, name+"{") && !strings.HasPrefix(line, name+" ") {
			continue
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		require.NoError(t, err, "metric line %q", line)
		sum += int(v)
	}
	return sum
}

// storedPositions returns the loyalty consumer's stored positions by
// partition.
func (h *harness) storedPositions(t *testing.T) map[int32]int64 {
	t.Helper()
	return testenv.Pairs[int32, int64](t, h.pool, fmt.Sprintf(
		"SELECT partition, settled_below FROM %s.kafka_positions WHERE consumer = 'loyalty' AND topic = $1",
		pgx.Identifier{h.schema}.Sanitize()), h.topic)
}

// endOffsets returns the topic's end offsets by partition.
func (h *harness) endOffsets(t *testing.T) map[int32]int64 {
	t.Helper()
	ends, err := kadm.NewClient(h.kcl).ListEndOffsets(context.Background(), h.topic)
	require.NoError(t, err)
	out := map[int32]int64{}
	ends.Each(func(o kadm.ListedOffset) { out[o.Partition] = o.Offset })
	return out
}

// settledAll waits until p has settled n deliveries (applied or duplicate).
func (h *harness) settledAll(t *testing.T, p *proc, n int) map[string]int {
	t.Helper()
	var got map[string]int
	h.waitFor(fmt.Sprintf("%d deliveries settled", n), func() bool {
		got = p.outcomes(t)
		return got["applied"]+got["duplicate"] >= n
	})
	return got
}

// runAndStop consumes ords to the end with one consumer, checks the
// stored positions reached the topic's end offsets, and stops it
// gracefully (its offsets committed).
func (h *harness) runAndStop(t *testing.T, env []string, ords []order) {
	t.Helper()
	p := h.start(env...)
	h.publish(ords...)
	h.waitApplied(len(ords))
	h.settledAll(t, p, len(ords))
	ends := h.endOffsets(t)
	h.waitFor("stored positions at the end offsets", func() bool {
		got := h.storedPositions(t)
		for part, end := range ends {
			if end > 0 && got[part] != end {
				return false
			}
		}
		return true
	})
	p.stop()
	require.NoError(t, p.err, "graceful stop:\n%s", p.out.String())
}

// groupCommitted is the sum of the group's committed offsets.
func (h *harness) groupCommitted(t *testing.T) int64 {
	t.Helper()
	offs, err := kadm.NewClient(h.kcl).FetchOffsets(context.Background(), h.group)
	require.NoError(t, err)
	var sum int64
	offs.Each(func(o kadm.OffsetResponse) {
		if o.Err == nil && o.At > 0 {
			sum += o.At
		}
	})
	return sum
}

// rewindGroup commits offset 0 for every partition of the topic: an
// operator's offset reset to the start (the group has no member).
func (h *harness) rewindGroup(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	var os kadm.Offsets
	for part := range h.endOffsets(t) {
		os.Add(kadm.Offset{Topic: h.topic, Partition: part, At: 0, LeaderEpoch: -1})
	}
	resp, err := kadm.NewClient(h.kcl).CommitOffsets(ctx, h.group, os)
	require.NoError(t, err)
	require.NoError(t, resp.Error())
}

// deleteGroup deletes the consumer group (the group has no member).
func (h *harness) deleteGroup(t *testing.T) {
	t.Helper()
	h.waitFor("the group deleted", func() bool {
		resp, err := kadm.NewClient(h.kcl).DeleteGroup(context.Background(), h.group)
		return err == nil && resp.Err == nil
	})
}

// TestKafkaPositionsSIGKILL: a consumer SIGKILLed mid-run leaves the
// group's committed offsets up to a commit interval (1 s) behind its
// committed claim transactions. Restarted, it delivers that work again
// without stored positions (the claims turn it into duplicates) and, per
// message, not at all with them; in batches only what a batch committed
// while an earlier one of its partition was still in flight (the position
// never passes an unsettled record). Deliveries per order are logged for
// both.
func TestKafkaPositionsSIGKILL(t *testing.T) {
	t.Parallel()
	for _, m := range positionModes {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			dups := map[bool]int{}
			for _, on := range []bool{false, true} {
				h := newHarness(t, "kafka")
				// A few seconds' work, killed mid-run once the group has
				// committed offsets (at least one commit interval in).
				n, env := 2400, append([]string{}, m.env...)
				if m.name == "per-message" {
					env = append(env, "LOYALTY_HANDLER_DELAY=5ms")
				} else {
					n = 120000 // about 40,000 orders a second
				}
				if !on {
					env = append(env, "CLAIM_NO_POSITIONS=true")
				}
				all := orders(1, n)
				app := "loyalty-positions-" + randID()
				a := h.start(append(env, "DATABASE_URL="+h.dbURLNamed(t, app))...)
				h.publish(all...)
				h.waitFor("a third of the orders applied and offsets committed", func() bool {
					return h.tryCount("SELECT count(*) FROM point_ledger") >= n/3 && h.groupCommitted(t) > 0
				})
				a.kill()
				// A COMMIT the process sent just before it died still runs
				// in its backend: count once those backends are gone.
				h.waitFor("the killed consumer's sessions to end", func() bool {
					return h.tryCount("SELECT count(*) FROM pg_stat_activity WHERE application_name = $1", app) == 0
				})
				before := h.count("SELECT count(*) FROM point_ledger")
				require.Less(t, before, n, "killed mid-run")

				restart := m.env
				if !on {
					restart = append(append([]string{}, m.env...), "CLAIM_NO_POSITIONS=true")
				}
				b := h.start(restart...)
				h.waitApplied(n)
				// Every record not settled before the kill is delivered to b.
				got := h.settledAll(t, b, n-before)
				h.assertExact(all)
				dups[on] = got["duplicate"]
				t.Logf("positions %-5t: killed at %d of %d applied; restarted consumer: %d applied, %d duplicates: %.3f deliveries per order",
					on, before, n, got["applied"], got["duplicate"], float64(n+got["duplicate"])/float64(n))
				require.Equal(t, n-before, got["applied"])
				if on {
					h.waitFor("stored positions at the end offsets", func() bool {
						ps, ends := h.storedPositions(t), h.endOffsets(t)
						for part, end := range ends {
							if ps[part] != end {
								return false
							}
						}
						return true
					})
					t.Logf("partitions started at their stored position: %d", b.metricSum(t, skippedMetric))
				} else {
					require.Empty(t, h.storedPositions(t), "no positions stored with CLAIM_NO_POSITIONS")
				}
			}
			if m.name == "per-message" {
				require.Zero(t, dups[true], "per message, committed work is not delivered again")
			} else {
				// At most a window (2 workers x 64) per partition.
				require.LessOrEqual(t, dups[true], 3*2*64, "in batches, at most a window per partition again")
			}
			t.Logf("%s: duplicates after SIGKILL: %d without positions, %d with", m.name, dups[false], dups[true])
		})
	}
}

// TestKafkaPositionsCrashAfterCommit: the consumer SIGKILLs itself after
// order 3's claim transaction committed and before the ack (per message
// and in batches). The stored position committed with the claim, so the
// restarted consumer does not deliver order 3 again at all (the claims'
// side of the same crash: TestCrashAfterCommitBeforeAck, with positions
// off), and every order is credited once.
func TestKafkaPositionsCrashAfterCommit(t *testing.T) {
	t.Parallel()
	for _, m := range []struct {
		name string
		env  []string
	}{{"per-message", []string{"CONCURRENCY=1"}}, {"batch", []string{"BATCH_SIZE=16", "BATCH_WORKERS=1"}}} {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			h := newHarnessWith(t, "kafka", harnessOptions{partitions: 1})
			ords := orders(1, 40)
			h.publish(ords...)
			p := h.start(append([]string{"LOYALTY_CRASH_AFTER_COMMIT=3"}, m.env...)...)
			require.True(t, p.exited(60*time.Second), "the consumer should have killed itself after committing order 3")
			require.Contains(t, p.out.String(), "SIGKILL after commit")
			require.Equal(t, 1, h.count("SELECT count(*) FROM point_ledger WHERE order_id = 3"))
			committed := h.count("SELECT count(*) FROM point_ledger")

			p2 := h.start(append([]string{"LOG_LEVEL=debug"}, m.env...)...)
			h.waitApplied(len(ords))
			got := h.settledAll(t, p2, len(ords)-committed)
			h.assertExact(ords)
			require.Equal(t, len(ords)-committed, got["applied"])
			require.Zero(t, got["duplicate"], "nothing committed is delivered again")
			require.NotContains(t, p2.out.String(), `order_id=3 outcome=`)
			require.Contains(t, p2.out.String(), "Group offset is below the position stored with the claims")
		})
	}
}

// TestKafkaPositionsGroupReset: the group deleted (per message) or its
// offsets rewound to the start (batches): the restarted consumer starts at
// the stored positions, so no order is delivered again (no duplicate
// outcome, nothing re-applied), says so at WARN, and counts the skips;
// the orders published meanwhile are applied.
func TestKafkaPositionsGroupReset(t *testing.T) {
	t.Parallel()
	for _, m := range positionModes {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, "kafka")
			first, more := orders(1, 100), orders(101, 20)
			h.runAndStop(t, m.env, first)
			if m.name == "per-message" {
				h.deleteGroup(t)
			} else {
				h.rewindGroup(t)
			}
			h.publish(more...)
			b := h.start(m.env...)
			h.waitApplied(len(first) + len(more))
			got := h.settledAll(t, b, len(more))
			h.assertExact(append(first, more...))
			require.Equal(t, len(more), got["applied"])
			require.Zero(t, got["duplicate"], "records below the stored positions are not delivered")
			b.waitLog(t, "Group offset is below the position stored with the claims: starting at the stored position")
			require.Contains(t, b.out.String(), "level=WARN msg=\"Group offset is below the position stored with the claims")
			require.Equal(t, 3, b.metricSum(t, skippedMetric), "one skip per partition")
		})
	}
}

// TestKafkaPositionsReplayOnPurpose: with CLAIM_REPLAY_BELOW_POSITIONS the
// same reset replays from the start, and the claims turn every replayed
// order into a duplicate.
func TestKafkaPositionsReplayOnPurpose(t *testing.T) {
	t.Parallel()
	h := newHarness(t, "kafka")
	first, more := orders(1, 60), orders(61, 10)
	h.runAndStop(t, nil, first)
	h.deleteGroup(t)
	h.publish(more...)
	b := h.start("CLAIM_REPLAY_BELOW_POSITIONS=true")
	h.waitApplied(len(first) + len(more))
	got := h.settledAll(t, b, len(first)+len(more))
	h.assertExact(append(first, more...))
	require.Equal(t, len(more), got["applied"])
	require.Equal(t, len(first), got["duplicate"], "replayed through the claims")
	require.Contains(t, b.out.String(), "replaying from the group offset as configured")
	require.Zero(t, b.metricSum(t, skippedMetric))
}

// TestKafkaPositionsRetentionExpiredReplay: the retention hole. Claims
// removed by a (forced) retention run cannot recognise a replay of their
// messages; the stored positions can. The group rewound to the start,
// nothing is applied again, per message and in batches. Without the
// positions (CLAIM_NO_POSITIONS) the same replay credits every order a
// second time: the hole, shown for contrast.
func TestKafkaPositionsRetentionExpiredReplay(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		env  []string
		off  bool
	}{
		{"per-message", nil, false},
		{"batch", []string{"BATCH_SIZE=64"}, false},
		{"per-message without positions", []string{"CLAIM_NO_POSITIONS=true"}, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, "kafka")
			first, more := orders(1, 80), orders(81, 10)
			if c.off {
				p := h.start(c.env...)
				h.publish(first...)
				h.waitApplied(len(first))
				h.settledAll(t, p, len(first))
				p.stop()
			} else {
				h.runAndStop(t, c.env, first)
			}
			st, err := store.New(h.pool, store.Config{Schema: h.schema})
			require.NoError(t, err)
			res, err := st.Cleanup(context.Background(), store.RetentionConfig{Retention: time.Millisecond, Force: true, Pause: -1})
			require.NoError(t, err)
			require.EqualValues(t, len(first), res.Deleted, "every claim removed by retention")
			if !c.off {
				require.Len(t, h.storedPositions(t), 3, "retention leaves the positions alone")
			}
			h.rewindGroup(t)
			h.publish(more...)
			b := h.start(c.env...)
			want := len(first) + len(more)
			if c.off {
				want += len(first) // the hole: applied again
			}
			h.waitFor("every delivery settled", func() bool {
				return h.tryCount("SELECT count(*) FROM point_ledger") >= want
			})
			got := h.settledAll(t, b, want-len(first))
			require.Equal(t, want-len(first), got["applied"])
			require.Zero(t, got["duplicate"])
			if c.off {
				require.Equal(t, want, h.count("SELECT count(*) FROM point_ledger"), "without positions the replay is applied again")
				return
			}
			h.assertExact(append(first, more...))
		})
	}
}
