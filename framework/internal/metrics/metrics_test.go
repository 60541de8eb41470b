package metrics_test

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/framework/internal/metrics"
)

// A series that does not exist reads as "no data" on a dashboard, not 0:
// InitConsumer must create every outcome and retry cause up front, and
// every metric New registers must then be exported.
func TestInitConsumerExportsZeroSeries(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := metrics.New(reg)
	require.NoError(t, err)
	m.InitConsumer("loyalty", "loyalty")

	n, err := testutil.GatherAndCount(reg)
	require.NoError(t, err)
	// 6 outcomes + 5 retry causes + 1 mismatch + 1 claim wait + 3
	// transaction outcomes + 1 poison memo errors + 3 poison refusal
	// fallbacks + 1 unordered.
	require.Equal(t, 21, n)
	mfs, err := reg.Gather()
	require.NoError(t, err)
	var names, causes []string
	for _, mf := range mfs {
		names = append(names, mf.GetName())
		if mf.GetName() != "claimtx_retries_total" {
			continue
		}
		for _, s := range mf.GetMetric() {
			for _, l := range s.GetLabel() {
				if l.GetName() == "cause" {
					causes = append(causes, l.GetValue())
				}
			}
		}
	}
	// The Kafka position series are per topic and partition, which only
	// the subscriber knows: they appear with the first position; the parked
	// gauges only for a consumer with an order key, with its first count.
	var want []string
	for _, n := range metrics.Names() {
		if !strings.HasPrefix(n, "claimtx_kafka_position") && !strings.HasPrefix(n, "claimtx_parked") {
			want = append(want, n)
		}
	}
	require.ElementsMatch(t, want, names)
	require.ElementsMatch(t, []string{"serialization", "deadlock", "claim_wait", "connection", "handler"}, causes)
}
