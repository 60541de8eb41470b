package store

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestNextBatchSize(t *testing.T) {
	t.Parallel()
	ms := time.Millisecond
	cfg := RetentionConfig{MinBatchSize: 100, MaxBatchSize: 10000, TargetBatchDuration: 200 * ms}.withDefaults()
	require.Equal(t, 1250, nextBatchSize(1000, 160*ms, cfg), "scaled toward the target")
	require.Equal(t, 2000, nextBatchSize(1000, 50*ms, cfg), "at most doubles")
	require.Equal(t, 2000, nextBatchSize(1000, 0, cfg), "a zero duration counts as 1ms")
	require.Equal(t, 500, nextBatchSize(1000, time.Hour, cfg), "at most halves")
	require.Equal(t, 10000, nextBatchSize(8000, ms, cfg), "capped")
	require.Equal(t, 100, nextBatchSize(150, time.Hour, cfg), "floored")
}
