package main

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

var kinds = []string{"amqp", "kafka", "nats"}

// forEachKind runs f in parallel subtests, one per broker, each with a
// harness of its own.
func forEachKind(t *testing.T, f func(t *testing.T, h *harness)) {
	t.Helper()
	t.Parallel()
	for _, kind := range kinds {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			f(t, newHarness(t, kind))
		})
	}
}

func orders(from, n int) []order {
	out := make([]order, n)
	for i := range out {
		id := int64(from + i)
		out[i] = order{OrderID: id, CustomerID: id%7 + 1, TotalCents: 100*id + 37}
	}
	return out
}

// A consumer SIGKILLed after its claim transaction committed and before the
// broker got the ack: the redelivery must be recognised as a duplicate. The
// restarted consumer runs with LOG_LEVEL=debug and proves it: order 3 came
// again and its outcome was "duplicate" (log and /metrics), while the orders
// not committed before the crash were applied.
func TestCrashAfterCommitBeforeAck(t *testing.T) {
	forEachKind(t, func(t *testing.T, h *harness) {
		// The claim's side of it: on Kafka the positions stored with the
		// claims would skip order 3 instead of delivering it again
		// (TestKafkaPositionsCrashAfterCommit).
		h.extraEnv = append(h.extraEnv, "CLAIM_NO_POSITIONS=true")
		if h.kind == "amqp" {
			// Group commit widens the window to CONCURRENCY x MaxGroup;
			// one delivery in flight makes order 3 the only one unacked.
			h.extraEnv = append(h.extraEnv, "AMQP_WINDOW=1")
		}
		os := orders(1, 5)
		app := "loyalty-crash-" + randID()
		p := h.start("DATABASE_URL="+h.dbURLNamed(t, app), "LOYALTY_CRASH_AFTER_COMMIT=3", "CONCURRENCY=1")
		h.publish(os...)
		require.True(t, p.exited(60e9), "the consumer should have killed itself after committing order 3")
		require.Contains(t, p.out.String(), "SIGKILL after commit")
		require.Equal(t, 1, h.count("SELECT count(*) FROM point_ledger WHERE order_id = 3"), "order 3 committed before the crash")
		// Kafka runs its 3 partitions in parallel, so orders of other
		// partitions may have committed before the crash too, and a
		// COMMIT the process sent just before it died still runs in its
		// backend: count once those backends are gone.
		h.waitFor("the killed consumer's sessions to end", func() bool {
			return h.tryCount("SELECT count(*) FROM pg_stat_activity WHERE application_name = $1", app) == 0
		})
		committed := h.count("SELECT count(*) FROM point_ledger")

		p2 := h.start("LOG_LEVEL=debug")
		h.waitApplied(len(os))
		// The redelivery of order 3 reached the claim and was acked as a
		// duplicate without running the handler.
		p2.waitLog(t, `msg="loyalty: outcome" order_id=3 outcome=duplicate`)
		require.Contains(t, p2.out.String(), "claimtx: duplicate delivery acked without running the handler")
		require.NotContains(t, p2.out.String(), `order_id=3 outcome=applied`)
		var got map[string]int
		require.Eventually(t, func() bool {
			got = p2.outcomes(t)
			return got["applied"] == len(os)-committed
		}, 30*time.Second, 20*time.Millisecond, "applied after restart")
		require.GreaterOrEqual(t, got["duplicate"], 1, "outcomes: %v", got)
		if h.kind == "amqp" {
			// One delivery in flight (AMQP_WINDOW=1): only order 3 was
			// unacked when the consumer died.
			require.Equal(t, 1, got["duplicate"], "outcomes: %v", got)
		}
		require.Zero(t, got["failed"]+got["poisoned"], "outcomes: %v", got)
		h.assertExact(os)
		// The claim of order 3 is the one from before the crash.
		require.Equal(t, 1, h.count(fmt.Sprintf(`SELECT count(*) FROM %q.processed_messages WHERE message_key = 'order-completed:3'`, h.schema)))
	})
}

// The same crash in batch mode: the whole batch holding order 3 committed,
// none of it was acked; after the restart order 3 (and its batch-mates)
// come again as duplicates and every order is credited once.
func TestBatchCrashAfterCommitBeforeAck(t *testing.T) {
	forEachKind(t, func(t *testing.T, h *harness) {
		// As above: the claim's side (positions: TestKafkaPositionsCrashAfterCommit).
		h.extraEnv = append(h.extraEnv, "CLAIM_NO_POSITIONS=true")
		os := orders(1, 60)
		h.publish(os...)
		p := h.start("LOYALTY_CRASH_AFTER_COMMIT=3", "BATCH_SIZE=16", "BATCH_WORKERS=1")
		require.True(t, p.exited(60e9), "the consumer should have killed itself after committing order 3")
		require.Contains(t, p.out.String(), "SIGKILL after commit")
		require.Contains(t, p.out.String(), "consuming in batches")
		require.Equal(t, 1, h.count("SELECT count(*) FROM point_ledger WHERE order_id = 3"), "order 3 committed before the crash")

		p2 := h.start("LOG_LEVEL=debug", "BATCH_SIZE=16")
		h.waitApplied(len(os))
		p2.waitLog(t, `msg="loyalty: outcome" order_id=3 outcome=duplicate`)
		require.NotContains(t, p2.out.String(), `order_id=3 outcome=applied`)
		h.assertExact(os)

		// The handler delay wraps the per-message handler only: with
		// batches it is refused, not silently ignored.
		p3 := h.start("BATCH_SIZE=16", "LOYALTY_HANDLER_DELAY=1s")
		require.True(t, p3.exited(30e9), "a refused configuration must stop the consumer")
		require.Contains(t, p3.out.String(), "LOYALTY_HANDLER_DELAY")
	})
}

func TestGracefulRestart(t *testing.T) {
	forEachKind(t, func(t *testing.T, h *harness) {
		os := orders(1, 300)
		p := h.start()
		h.publish(os...)
		h.waitApplied(50)
		p.stop()
		require.NoError(t, p.err, "SIGTERM must end the consumer cleanly:\n%s", p.out.String())
		h.start()
		h.waitApplied(len(os))
		h.assertExact(os)
	})
}

// A replay through a fresh process (a group reset, everything republished
// after a restore), per message and in batches: the old orders are
// duplicates, most answered by the committed-key read-ahead rather than by
// a claim transaction each, and the new orders mixed into the replay are
// still applied, once.
func TestColdReplayAfterRestart(t *testing.T) {
	for _, mode := range []struct {
		name string
		env  []string
	}{{"per-message", nil}, {"batch", []string{"BATCH_SIZE=32"}}} {
		t.Run(mode.name, func(t *testing.T) {
			forEachKind(t, func(t *testing.T, h *harness) {
				// The outcomes must come out exact, so no rebalance may
				// replay part of the stream: the default 10s session,
				// not the harness's 3s (for the kill tests), which a
				// stall of a loaded -race run can expire.
				h.extraEnv = append(h.extraEnv, "KAFKA_SESSION_TIMEOUT=10s", "KAFKA_REBALANCE_TIMEOUT=10s")
				old := orders(1, 400)
				p := h.start(mode.env...)
				h.publish(old...)
				h.waitApplied(len(old))
				p.stop()
				require.NoError(t, p.err, "SIGTERM must end the consumer cleanly:\n%s", p.out.String())

				// The replay, a new order after every 50 old ones.
				var replay, fresh []order
				for i, o := range old {
					replay = append(replay, o)
					if i%50 == 49 {
						n := orders(1000+i, 1)[0]
						replay, fresh = append(replay, n), append(fresh, n)
					}
				}
				p2 := h.start(mode.env...)
				h.publish(replay...)
				var got map[string]int
				require.Eventually(t, func() bool {
					got = p2.outcomes(t)
					return got["applied"]+got["duplicate"] >= len(replay)
				}, 60*time.Second, 20*time.Millisecond, "replay settled")
				require.Equal(t, map[string]int{"applied": len(fresh), "duplicate": len(old), "expired": 0, "failed": 0, "parked": 0, "poisoned": 0}, got)
				h.assertExact(append(old, fresh...))
			})
		})
	}
}

// Two competing consumers (one queue / one group), every order published
// three times with fresh broker ids: exact balances.
func TestCompetingConsumersWithDuplicates(t *testing.T) {
	forEachKind(t, func(t *testing.T, h *harness) {
		os := orders(1, 200)
		h.start()
		h.start()
		h.publish(os...)
		h.publish(os...)
		h.publish(os...)
		h.waitApplied(len(os))
		// Let the copies drain before judging: every delivery ends up
		// as applied or duplicate, observed through the claim count.
		h.waitFor("claims", func() bool {
			return h.tryCount(fmt.Sprintf(`SELECT count(*) FROM %q.processed_messages`, h.schema)) == len(os)
		})
		h.assertExact(os)
	})
}

// Bad messages go to TOPIC.poison with the reason, while good ones keep
// flowing past them.
func TestBadMessagesArePoisonedWithReason(t *testing.T) {
	forEachKind(t, func(t *testing.T, h *harness) {
		h.start()
		good := orders(1, 20)
		h.publish(good[:10]...)
		bad := map[string]string{
			"bad-json":    `{"order_id": `,
			"bad-nokey":   `{"customer_id": 1, "total_cents": 100}`,
			"bad-type":    `{"order_id": {"x": 1}, "customer_id": 1, "total_cents": 100}`,
			"bad-missing": `{"order_id": 777, "total_cents": 100}`,
			"bad-neg":     `{"order_id": 778, "customer_id": 1, "total_cents": -5}`,
		}
		var ids []string
		var payloads [][]byte
		for id, p := range bad {
			ids, payloads = append(ids, id), append(payloads, []byte(p))
		}
		h.publishRaw(ids, payloads)
		h.publish(good[10:]...)
		h.waitApplied(len(good))
		ps := h.poisoned(len(bad))
		reasons := map[string]string{}
		for _, m := range ps {
			reasons[m.headers["event_id"]] = m.headers["claimtx_poison_reason"]
			require.Contains(t, bad, m.headers["event_id"])
			require.Equal(t, bad[m.headers["event_id"]], string(m.body), "the original payload is kept")
		}
		require.Contains(t, reasons["bad-json"], "not valid JSON")
		require.Contains(t, reasons["bad-nokey"], `payload "order_id": field is missing`)
		require.Contains(t, reasons["bad-type"], "an object")
		require.Contains(t, reasons["bad-missing"], "customer_id is missing")
		require.Contains(t, reasons["bad-neg"], "negative")
		h.assertExact(good)
	})
}

// TestNoCredentialsInLogs runs a consumer with a password in every URL and
// checks no log line carries it, including on the poison path.
func TestNoCredentialsInLogs(t *testing.T) {
	t.Parallel()
	h, amqpPass, pgPass := secretHarness(t, "claimtx_redact_")

	p := h.start("KAFKA_SASL_PASSWORD=KafkaPw-unused")
	good := orders(1, 10)
	h.publish(good...)
	h.publishRaw([]string{"bad"}, [][]byte{[]byte("not json")})
	h.waitApplied(len(good))
	h.poisoned(1)
	p.stop()
	logs := p.out.String()
	require.NotEmpty(t, logs)
	for _, secret := range []string{amqpPass, pgPass, "KafkaPw-unused"} {
		require.NotContains(t, logs, secret)
	}
}

// TestNATSSIGKILLMidWorkLosesNothing: two consumers on NATS JetStream
// work through a backlog, each with claim transactions open (the handler
// holds each one 30 ms) and more messages delivered and not yet acked;
// one is SIGKILLed mid-work. JetStream redelivers what it held after the
// ack wait (NATS_ACK_WAIT=3s here), to the survivor or a replacement:
// every order credited exactly once, every message acked in the end, and
// the durable consumer the adapter created never gives up on a message
// (MaxDeliver -1).
func TestNATSSIGKILLMidWorkLosesNothing(t *testing.T) {
	t.Parallel()
	h := newHarness(t, "nats")
	os := orders(1, 400)
	h.publish(os...)
	victim := h.start("LOYALTY_HANDLER_DELAY=30ms")
	h.start("LOYALTY_HANDLER_DELAY=30ms")
	h.waitApplied(40)

	ci, err := h.js.ConsumerInfo(h.topic, "loyalty")
	require.NoError(t, err)
	require.Equal(t, -1, ci.Config.MaxDeliver)
	require.Equal(t, 3*time.Second, ci.Config.AckWait)
	require.Empty(t, ci.Config.DeliverSubject, "a pull consumer")
	require.Positive(t, ci.NumAckPending, "messages in flight when the consumer is killed")

	victim.kill()
	h.start()
	h.waitApplied(len(os))
	h.waitFor("every message acked", func() bool { return h.natsUnsettled() == 0 })
	h.assertExact(os)
	require.Equal(t, len(os), h.count(fmt.Sprintf(`SELECT count(*) FROM %q.processed_messages`, h.schema)), "claims")
	require.Empty(t, h.natsPoison(), "nothing poisoned")
}
