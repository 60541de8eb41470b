package testenv

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
)

// MetricSum sums, over the series of reg's metric family name whose labels
// include labels (name, value pairs), a counter's or a gauge's value or a
// histogram's sample count: 0 when no series matches.
func MetricSum(t testing.TB, reg prometheus.Gatherer, name string, labels ...string) float64 {
	t.Helper()
	sum, _ := metric(t, reg, name, labels)
	return sum
}

// RequireMetric is MetricSum that fails the test when no series matches.
func RequireMetric(t testing.TB, reg prometheus.Gatherer, name string, labels ...string) float64 {
	t.Helper()
	sum, found := metric(t, reg, name, labels)
	require.True(t, found, "no series %s%v", name, labels)
	return sum
}

func metric(t testing.TB, reg prometheus.Gatherer, name string, labels []string) (sum float64, found bool) {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			have := map[string]string{}
			for _, lp := range m.GetLabel() {
				have[lp.GetName()] = lp.GetValue()
			}
			for i := 0; i+1 < len(labels); i += 2 {
				if have[labels[i]] != labels[i+1] {
					continue series
				}
			}
			found = true
			// Only the metric's own type is set; the others read as 0.
			sum += m.GetCounter().GetValue() + m.GetGauge().GetValue() + float64(m.GetHistogram().GetSampleCount())
		}
	}
	return sum, found
}
