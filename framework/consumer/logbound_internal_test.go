package consumer

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/stretchr/testify/require"
)

// TestLoggedErrorsAreBounded: Watermill's router and Retry log every
// handler error through the consumer's adapter, once per retry and per
// nack; an error of 40 kB is logged cut to 4 KiB, marked with the whole
// text's length and hash, and still unwraps to itself. A short one is
// logged as it is, and derived loggers keep the bound.
func TestLoggedErrorsAreBounded(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	a := newSlogAdapter(slog.New(slog.NewTextHandler(&buf, nil)))
	cause := errors.New("boom")
	long := fmt.Errorf("json: cannot unmarshal number %s: %w", strings.Repeat("9", 40_000), cause)
	a.With(watermill.LogFields{"handler": "loyalty"}).Error("Error occurred, retrying", long, nil)
	line := buf.String()
	require.Less(t, len(line), 5000, "one bounded line")
	require.Contains(t, line, fmt.Sprintf("truncated: %d bytes, sha256:", len(long.Error())))
	require.Contains(t, line, "handler=loyalty")
	require.ErrorIs(t, boundError(long), cause)

	buf.Reset()
	a.Error("Handler returned error", cause, nil)
	require.Contains(t, buf.String(), `error=boom`)
	require.Nil(t, boundError(nil))
}
