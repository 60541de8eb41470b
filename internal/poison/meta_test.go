package poison

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"
)

// TestBoundReason: a reason is kept whole when it fits, repaired to valid
// UTF-8 without NUL bytes either way, and otherwise cut on a rune boundary
// to exactly fit with the marker, whatever the limit (the marker alone
// when the limit is below minReasonBytes).
func TestBoundReason(t *testing.T) {
	t.Parallel()
	r, cut := BoundReason("short", MaxReasonBytes)
	require.Equal(t, "short", r)
	require.False(t, cut)
	r, cut = BoundReason("a\x00b\xffc", MaxReasonBytes)
	require.Equal(t, "a\uFFFDb\uFFFDc", r)
	require.False(t, cut)

	long := strings.Repeat("é", 10_000) // two bytes a rune: cuts land mid-rune
	for _, limit := range []int{0, 1, minReasonBytes, 129, ShortReasonBytes, 257, MaxReasonBytes, MaxReasonBytes + 1} {
		r, cut := BoundReason(long, limit)
		require.True(t, cut, "limit %d", limit)
		require.LessOrEqual(t, len(r), max(limit, minReasonBytes), "limit %d", limit)
		require.GreaterOrEqual(t, len(r), max(limit, minReasonBytes)-utf8.UTFMax, "limit %d: fills the room", limit)
		require.True(t, utf8.ValidString(r), "limit %d", limit)
		require.True(t, strings.HasSuffix(r, "… [truncated: 20000 bytes, sha256:"+ReasonHash(long)+"]"), "limit %d: %q", limit, r)
	}
	r, _ = BoundReason(long, MaxReasonBytes)
	require.True(t, strings.HasPrefix(r, strings.Repeat("é", 1000)))
}
