package consumer_test

import (
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/framework/consumer"
	"github.com/claimtx/claimtx/middleware"
	"github.com/claimtx/claimtx/store"
)

// claimtx_messages_total is a count of messages: dashboards divide by it.
// Each delivery that is acked or nacked must add exactly one outcome to it
// (and one call of Config.OnOutcome), however often it was retried in
// process on the way; retries are counted in claimtx_retries_total.
func TestOneOutcomePerMessage(t *testing.T) {
	t.Parallel()
	forEachBrokerAndMode(t, testOneOutcomePerMessage)
}

func testOneOutcomePerMessage(t *testing.T, kind, mode string) {
	pool, schema, topic, rb := effectsFixture(t, kind, "outcomes-"+mode)
	h := newPolicyHandler()
	reg := prometheus.NewRegistry()
	var mu sync.Mutex
	hooked := map[framework.Outcome]int{}
	c := newModeConsumer(t, mode, consumer.Config{
		Name: "outcomes", Topic: topic, Key: "metadata:event_id", Pool: pool,
		Store: store.Config{Schema: schema}, Broker: rb.cfg,
		Claim: middleware.Claim{MaxAttempts: policyMaxAttempts}, HandlerRetries: policyHandlerRetries,
		RetryInitialInterval: 5 * time.Millisecond, Logger: slog.New(slog.DiscardHandler),
		Registerer: reg,
		OnOutcome: func(r middleware.Result) {
			mu.Lock()
			defer mu.Unlock()
			hooked[r.Outcome]++
		},
	}, h.apply, perMessage(h.apply))

	// Every series exists, at zero, before the first message.
	before := gather(t, reg)
	for _, o := range []framework.Outcome{framework.Applied, framework.Duplicate, framework.Failed, framework.Poisoned, framework.Expired} {
		require.Contains(t, before, `claimtx_messages_total{outcome="`+string(o)+`"}`)
	}
	for _, cause := range []string{"serialization", "deadlock", "claim_wait", "connection", "handler"} {
		require.Contains(t, before, `claimtx_retries_total{cause="`+cause+`"}`)
	}
	require.Contains(t, before, `claimtx_fingerprint_mismatch_total{}`)

	_, stop := start(c)
	defer func() { require.NoError(t, stop()) }()

	id := int64(0)
	publish := func(do string, copies int) {
		id++
		for range copies {
			rb.publish(t, badRow{eventID: fmt.Sprintf("order-%d", id), payload: mustJSON(policyOrder{OrderID: id, Do: do})}, do)
		}
	}
	settled := func(applied, poisoned, outcomes int) {
		t.Helper()
		require.Eventually(t, func() bool {
			var n int
			require.NoError(t, pool.QueryRow(t.Context(), "SELECT count(*) FROM effects").Scan(&n))
			sum := 0
			for k, v := range gather(t, reg) {
				if strings.HasPrefix(k, "claimtx_messages_total{") {
					sum += int(v)
				}
			}
			return n == applied && rb.poisonCount(t) == poisoned && sum >= outcomes
		}, 60*time.Second, 20*time.Millisecond, "messages settled")
	}
	publish("ok", 1)        // applied
	publish("ok", 3)        // applied once, two duplicates
	publish("permanent", 1) // poisoned at once
	publish("error", 1)     // retried HandlerRetries times, then poisoned
	settled(2, 2, 6)
	// A transient failure alone: in batch mode it fails its whole batch,
	// so neighbours would be nacked along with it. Its first two
	// deliveries fail (the claim retries each once), the third applies.
	publish("transient", 1)
	settled(3, 2, 9)
	require.NoError(t, stop())

	got := gather(t, reg)
	count := func(o framework.Outcome) int { return int(got[`claimtx_messages_total{outcome="`+string(o)+`"}`]) }
	want := map[framework.Outcome]int{
		framework.Applied: 3, framework.Duplicate: 2, framework.Poisoned: 2, framework.Failed: 2, framework.Expired: 0,
	}
	for o, n := range want {
		require.Equal(t, n, count(o), "claimtx_messages_total{outcome=%q}", o)
	}
	mu.Lock()
	for o, n := range want {
		require.Equal(t, n, hooked[o], "Config.OnOutcome calls with outcome %q", o)
	}
	mu.Unlock()
	require.Equal(t, float64(policyHandlerRetries), got[`claimtx_retries_total{cause="handler"}`], "handler retries")
	// One claim retry in each of the two failed deliveries.
	require.Equal(t, float64(2), got[`claimtx_retries_total{cause="serialization"}`], "claim retries")

	if mode == "message" {
		// Watermill's router metrics carry claimtx's prefix too.
		var names []string
		mfs, err := reg.Gather()
		require.NoError(t, err)
		for _, mf := range mfs {
			names = append(names, mf.GetName())
			require.True(t, strings.HasPrefix(mf.GetName(), "claimtx_"), "unprefixed metric %s", mf.GetName())
		}
		require.Contains(t, names, "claimtx_handler_execution_time_seconds")
	}
}

// gather flattens reg's counters and histogram counts to
// name{label="value"} → value, leaving out the consumer and handler labels
// (one consumer per registry here).
func gather(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	out := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			var labels []string
			for _, lp := range m.GetLabel() {
				switch lp.GetName() {
				case "consumer", "handler":
				default:
					labels = append(labels, fmt.Sprintf("%s=%q", lp.GetName(), lp.GetValue()))
				}
			}
			key := mf.GetName() + "{" + strings.Join(labels, ",") + "}"
			switch mf.GetType() {
			case dto.MetricType_COUNTER:
				out[key] += m.GetCounter().GetValue()
			case dto.MetricType_HISTOGRAM:
				out[key] += float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return out
}
