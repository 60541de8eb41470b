package framework_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/framework"
)

// requireKeyRefusal checks that err is the typed, permanent key error the
// poison middleware reports, with a reason naming the limit.
func requireKeyRefusal(t *testing.T, err error, reason string) {
	t.Helper()
	require.ErrorIs(t, err, framework.ErrInvalidKey)
	var ke *framework.KeyError
	require.True(t, errors.As(err, &ke), "want a *KeyError, got %T: %v", err, err)
	require.True(t, framework.IsPermanent(err))
	require.ErrorContains(t, err, reason)
}

// A number longer than the key limit can never be a valid key (its
// canonical form is at least as long as its significant digits), so it is
// refused from its length alone, before canonicalisation, whose cost used
// to grow with the square of the digits or worse: a 40 kB number held a
// consumer for minutes, and in batch mode every message behind it.
func TestOverlongNumberRefusedBeforeCanonicalisation(t *testing.T) {
	t.Parallel()
	for _, spec := range []string{"json:order_id", "template:o:{payload.order_id}"} {
		kf, err := framework.ParseKeySpec(spec)
		require.NoError(t, err)
		for _, n := range []string{
			"0." + strings.Repeat("7", 600),
			strings.Repeat("9", 513),
			"1." + strings.Repeat("0", 40_000),
			"-0." + strings.Repeat("12", 20_000) + "e-5",
		} {
			_, err := kf(msgWith(`{"order_id": `+n+`}`, nil))
			requireKeyRefusal(t, err, "longer than the limit")
		}
		// At the limit a number is still canonicalised as before.
		k, err := kf(msgWith(`{"order_id": `+strings.Repeat("9", 512)+`}`, nil))
		require.NoError(t, err)
		require.True(t, strings.HasSuffix(k, strings.Repeat("9", 512)))
		k, err = kf(msgWith(`{"order_id": 1.`+strings.Repeat("0", 400)+`}`, nil))
		require.NoError(t, err)
		require.True(t, strings.HasSuffix(k, "1"), k)
	}
}

// JSON lookups bound what they decode: the payload's size and its nesting.
func TestPayloadLimits(t *testing.T) {
	t.Parallel()
	kf, err := framework.ParseKeySpec("template:o:{payload.id}")
	require.NoError(t, err)

	deep := `{"id": 1, "x": ` + strings.Repeat("[", 65) + strings.Repeat("]", 65) + `}`
	_, err = kf(msgWith(deep, nil))
	requireKeyRefusal(t, err, "nests deeper than 64")
	// Brackets inside strings are not nesting.
	k, err := kf(msgWith(`{"id": "`+strings.Repeat("[{", 100)+`"}`, nil))
	require.NoError(t, err)
	require.Equal(t, "o:"+strings.Repeat("[{", 100), k)
	ok := `{"id": 1, "x": ` + strings.Repeat("[", 63) + strings.Repeat("]", 63) + `}`
	_, err = kf(msgWith(ok, nil))
	require.NoError(t, err)

	big := `{"id": 1, "pad": "` + strings.Repeat("x", 4<<20) + `"}`
	_, err = kf(msgWith(big, nil))
	requireKeyRefusal(t, err, "larger than the limit")
}
