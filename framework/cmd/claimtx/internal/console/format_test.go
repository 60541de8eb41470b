package console

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// Payload previews are cut at 4 KiB; binary shows as base64.
func TestPreview(t *testing.T) {
	t.Parallel()
	require.Equal(t, "hello", preview([]byte("hello")))
	require.Equal(t, "base64: //4=", preview([]byte{0xff, 0xfe}))
	long := preview([]byte(strings.Repeat("a", 5000)))
	require.True(t, strings.HasPrefix(long, strings.Repeat("a", 4096)+" … (first 4096 bytes shown)"))
	require.Len(t, long, 4096+len(" … (first 4096 bytes shown)"))
}
