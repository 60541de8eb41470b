package chaos

import (
	"context"
	"io"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestQuantile(t *testing.T) {
	require.Zero(t, quantile(nil, 0.5))
	ds := []time.Duration{5 * time.Second, time.Second, 20 * time.Second, 2 * time.Second}
	require.Equal(t, 2*time.Second, quantile(ds, 0.5))
	require.Equal(t, 20*time.Second, quantile(ds, 1))
	require.Equal(t, time.Second, quantile(ds, 0))
	require.Equal(t, 5*time.Second, ds[0], "quantile must not sort its argument")
}

// TestConsumerEnvKafkaTimeouts: the consumers get the example's default
// Kafka timeouts unless a flag shortens them; the runner's own
// KAFKA_SESSION_TIMEOUT or KAFKA_REBALANCE_TIMEOUT never leaks through.
func TestConsumerEnvKafkaTimeouts(t *testing.T) {
	t.Setenv("KAFKA_SESSION_TIMEOUT", "3s")
	t.Setenv("KAFKA_REBALANCE_TIMEOUT", "3s")
	t.Setenv("BATCH_SIZE", "64")
	o := defaults()
	env := consumerEnv(o, "BROKER=kafka")
	require.Contains(t, env, "BROKER=kafka")
	require.Contains(t, env, "BATCH_SIZE=64", "the rest of the environment passes through")
	for _, kv := range env {
		require.False(t, strings.HasPrefix(kv, "KAFKA_SESSION_TIMEOUT=") || strings.HasPrefix(kv, "KAFKA_REBALANCE_TIMEOUT="), kv)
	}
	require.Equal(t, "default", kafkaTimeouts(o))

	o.kafkaSession, o.kafkaRebalance = 3*time.Second, 4*time.Second
	env = consumerEnv(o)
	require.True(t, slices.Contains(env, "KAFKA_SESSION_TIMEOUT=3s"))
	require.True(t, slices.Contains(env, "KAFKA_REBALANCE_TIMEOUT=4s"))
	require.Equal(t, "session:3s,rebalance:4s", kafkaTimeouts(o))
}

func TestReportVerdict(t *testing.T) {
	good := report{broker: "kafka", orders: 10, bad: 1, applied: 10, ledgerRows: 10, badPoisoned: 1,
		kills: 3, terms: 3, startTerms: 3, killTerms: 3, finalTerms: 3, minKills: 3, minTerms: 3,
		minStartTerms: 3, minKillTerms: 3, brokerDisruptions: 1, evictions: 0, midRebalance: 4}
	good.exits[termReady] = []time.Duration{100 * time.Millisecond, 200 * time.Millisecond}
	good.exits[termStarting] = []time.Duration{19 * time.Second}
	require.True(t, good.ok())
	sum := good.summary()
	require.True(t, strings.HasPrefix(sum, "chaos kafka OK: lost=0 doubled=0 wrongly_poisoned=0 crashes=0 hung_shutdowns=0 "), sum)
	require.Contains(t, sum, "sigterms=12 (ready=3 starting=3 after_kill=3 final=3; mid_rebalance=4)")
	require.Contains(t, sum, "sigterm_exit_p50=200ms sigterm_exit_max=19s")
	require.Contains(t, sum, "evictions=0")
	require.Contains(t, good.exitTimes(), "ready n=2 p50=100ms max=200ms; starting n=1 p50=19s max=19s; after_kill n=0; final n=0")

	hung := good
	hung.hung = 1
	require.False(t, hung.ok())
	require.Contains(t, hung.summary(), "FAIL: lost=0 doubled=0 wrongly_poisoned=0 crashes=0 hung_shutdowns=1 ")
	few := good
	few.startTerms = 2
	require.False(t, few.ok(), "fewer SIGTERMs while starting than asked for")
	few = good
	few.killTerms = 2
	require.False(t, few.ok(), "fewer SIGTERMs after a SIGKILL than asked for")

	amqp := good
	amqp.broker, amqp.evictions, amqp.midRebalance = "amqp", -1, -1
	require.NotContains(t, amqp.summary(), "evictions=")
	require.NotContains(t, amqp.summary(), "mid_rebalance")
}

// TestRunOptions: bad options are refused before anything is started.
func TestRunOptions(t *testing.T) {
	for want, edit := range map[string]func(*options){
		"-kafka-broker":          func(o *options) { o.kafkaBroker = "redpanda" },
		"-kafka-session-timeout": func(o *options) { o.kafkaSession = -time.Second },
		"-start-terms":           func(o *options) { o.minStartTerms = -1 },
		"-join-brokers":          func(o *options) { o.joinBrokers = []string{"mqtt"} },
		"-term-grace":            func(o *options) { o.termGrace = -time.Second },
		`unknown broker "mqtt"`:  func(o *options) { o.brokers = []string{"mqtt"} },
		// The default runs on a private cluster, which only
		// usePrivatePostgres starts (the binaries exist: any file does).
		"-pg-restart private": func(o *options) { o.loyalty, o.devkafka = os.Args[0], os.Args[0] },
	} {
		t.Run(want, func(t *testing.T) {
			o := defaults()
			o.out = io.Discard
			o.logDir = t.TempDir()
			edit(&o)
			_, err := run(context.Background(), o)
			require.ErrorContains(t, err, want)
		})
	}
	t.Run("bad DRAIN_TIMEOUT", func(t *testing.T) {
		t.Setenv("DRAIN_TIMEOUT", "soon")
		o := defaults()
		o.out = io.Discard
		_, err := run(context.Background(), o)
		require.ErrorContains(t, err, "DRAIN_TIMEOUT")
	})
}

func TestTermTimeoutDefault(t *testing.T) {
	t.Setenv("DRAIN_TIMEOUT", "")
	d, err := drainTimeout()
	require.NoError(t, err)
	require.Equal(t, 15*time.Second, d)
	t.Setenv("DRAIN_TIMEOUT", "30s")
	d, err = drainTimeout()
	require.NoError(t, err)
	require.Equal(t, 30*time.Second, d)
}

// TestRunChecksOptions: bad knobs fail before anything is started (no
// database, broker or consumer is touched).
func TestRunChecksOptions(t *testing.T) {
	o := defaults()
	o.orders = 0
	o.out = io.Discard
	_, err := run(context.Background(), o)
	require.ErrorContains(t, err, "-orders and -consumers must be positive")

	o = defaults()
	o.kafkaBroker = "redpanda"
	o.out = io.Discard
	_, err = run(context.Background(), o)
	require.ErrorContains(t, err, `-kafka-broker must be "devkafka" or "kfake"`)
}

// TestReportVerdictOrdered: in order mode the rejected orders are
// expected poison, never credited, and any inversion fails the run.
func TestReportVerdictOrdered(t *testing.T) {
	good := report{broker: "amqp", orders: 10, bad: 1, applied: 8, ledgerRows: 8, badPoisoned: 1,
		kills: 3, terms: 3, minKills: 3, minTerms: 3, brokerDisruptions: 1, evictions: -1, midRebalance: -1,
		ordered: true, rejected: 2, rejectedPoisoned: 2, skips: 2}
	require.True(t, good.ok())
	require.True(t, strings.HasPrefix(good.summary(), "chaos amqp  OK: lost=0 doubled=0 wrongly_poisoned=0 crashes=0 hung_shutdowns=0 out_of_order=0 rejected=2 rejected_poisoned=2/2 rejected_credited=0 parked_left=0 skips=2 "), good.summary())
	for name, edit := range map[string]func(*report){
		"out of order":      func(r *report) { r.outOfOrder = 1 },
		"rejected credited": func(r *report) { r.rejectedCredited, r.applied, r.ledgerRows = 1, 9, 9 },
		"rejected missing":  func(r *report) { r.rejectedPoisoned = 1 },
		"parked left":       func(r *report) { r.parkedLeft = 1 },
		"lost":              func(r *report) { r.applied, r.ledgerRows, r.lost = 7, 7, 1 },
	} {
		bad := good
		edit(&bad)
		require.False(t, bad.ok(), name)
	}
	unordered := good
	unordered.ordered, unordered.rejected = false, 0
	require.False(t, unordered.ok(), "outside order mode every order must be credited")
}

func TestRejectOrders(t *testing.T) {
	require.Equal(t, int64(101), customerOf(100, 1), "burst 1 is the plan's usual i%211+1")
	require.Equal(t, []int64{100, 300, 500, 522, 700, 900}, rejectOrders(1000, 1))
	require.Empty(t, rejectOrders(50, orderBurst))
	ids := rejectOrders(2000, orderBurst)
	require.Equal(t, []int64{100, 102, 300, 500, 700, 900, 1100, 1300, 1500, 1700, 1900}, ids)
	perCustomer := map[int64]int{}
	for _, id := range ids {
		perCustomer[customerOf(int(id), orderBurst)]++
	}
	require.Equal(t, 2, perCustomer[customerOf(100, orderBurst)], "one customer has a second rejected order behind its first")
	require.Len(t, perCustomer, 10)
}

// TestBadPayloadsDistinct: no two bad messages share a claim key, so each
// must reach the poison destination on its own, in order mode too.
func TestBadPayloadsDistinct(t *testing.T) {
	seen := map[string]bool{}
	for i := 0; i < 20; i++ {
		p := string(badPayload(i))
		if i%len(badPayloads) == 4 {
			require.False(t, seen[p], p)
			require.NotContains(t, p, "%")
		}
		seen[p] = true
	}
}
