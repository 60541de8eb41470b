package middleware

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestGroupSizeAdapts: contention halves the group size down to one and
// makes the next probe of a larger size rarer, so that rows every group
// writes are written by groups of one; a size of two or more that stays
// clean makes probes frequent again, and without contention the size
// stays MaxGroup.
func TestGroupSizeAdapts(t *testing.T) {
	const conns = 4
	g := &grouper{c: Claim{MaxGroup: 16}, conns: conns, size: 16, wait: conns, limit: conns}
	clean := func(n int) {
		for range n {
			g.settle(false, false)
		}
	}
	clean(1000)
	require.Equal(t, 16, g.size, "no contention: full groups")

	for _, want := range []int{8, 4, 2, 1, 1, 1, 1} {
		g.settle(true, false)
		require.Equal(t, want, g.size)
	}
	require.Equal(t, maxGrowWait*conns, g.wait, "the probes' spacing is bounded")

	// A group of one never meets contention: waiting wait clean groups at
	// size one probes size two, and says nothing about the rows.
	clean(g.wait - 1)
	require.Equal(t, 1, g.size)
	clean(1)
	require.Equal(t, 2, g.size)
	require.Equal(t, maxGrowWait*conns, g.wait)
	// Contended again at two: back to one, as rare probes as before.
	g.settle(true, false)
	require.Equal(t, 1, g.size)
	require.Equal(t, maxGrowWait*conns, g.wait)

	// The rows cooled: each size that stays clean halves the wait, so the
	// size is back at MaxGroup within a bounded number of groups.
	n := 0
	for g.size < 16 {
		g.settle(false, false)
		n++
	}
	require.Less(t, n, 3*maxGrowWait*conns+16*conns, "grew back in %d groups", n)
	require.Equal(t, conns, g.wait)

	// A transaction of one message deadlocked: from then on the number of
	// groups adapts, each taking MaxGroup.
	g.settle(false, true)
	require.True(t, g.serial)
	require.Equal(t, 16, g.size)
	require.Equal(t, conns/2, g.limit)
	g.settle(true, false)
	require.Equal(t, 1, g.limit)
	clean(4)
	require.Equal(t, 2, g.limit, "one more group after a round of clean ones")
	require.Equal(t, 16, g.size)
}
