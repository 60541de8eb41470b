package framework_test

import (
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/framework"
)

// requireKeyRefusal checks that err is the typed, permanent key error the
// poison middleware reports, with a reason naming the limit.
func requireKeyRefusal(t *testing.T, err error, reason string) {
	t.Helper()
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

// allocPerCall is the heap bytes one call of f allocates, averaged: a
// deterministic measure of work, unlike wall-clock time on a shared machine.
func allocPerCall(f func()) float64 {
	const runs = 20
	f() // warm up
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for i := 0; i < runs; i++ {
		f()
	}
	runtime.ReadMemStats(&after)
	return float64(after.TotalAlloc-before.TotalAlloc) / runs
}

// Key derivation is linear in its input: ten times the input costs about
// ten times the work, for every shape that reaches a key. Measured in bytes
// allocated (the old number rendering allocated a fresh rendering of every
// candidate precision: quadratic), with a generous bound. Not parallel, so
// that no other test allocates meanwhile.
func TestKeyDerivationLinear(t *testing.T) {
	tmpl, err := framework.ParseKeySpec("template:o:{payload.order_id}")
	require.NoError(t, err)
	meta, err := framework.ParseKeySpec("template:{metadata.a}:{metadata.b}")
	require.NoError(t, err)
	cases := []struct {
		name  string
		kf    framework.KeyFunc
		input func(n int) *message.Message // n ≈ size of the input in bytes
	}{
		{"number", tmpl, func(n int) *message.Message {
			// Under the number limit, so it is canonicalised, not refused.
			return msgWith(`{"order_id": -0.`+strings.Repeat("1234567890", n/10)+`e-3}`, nil)
		}},
		{"strings", tmpl, func(n int) *message.Message {
			return msgWith(fill(`{"order_id": "A-17", "s": [`, `]}`, n, func(int) string { return `"x\"y\u00e9z"` }), nil)
		}},
		{"nested", tmpl, func(n int) *message.Message {
			tree := strings.Repeat(`{"a": [`, 30) + `1` + strings.Repeat(`]}`, 30)
			return msgWith(fill(`{"order_id": 7, "t": [`, `]}`, n, func(int) string { return tree }), nil)
		}},
		{"fields", tmpl, func(n int) *message.Message {
			return msgWith(fill(`{"order_id": 7, `, `}`, n, func(i int) string { return fmt.Sprintf(`"f%d": %d.5`, i, i) }), nil)
		}},
		{"escaped metadata", meta, func(n int) *message.Message {
			return msgWith("", map[string]string{"a": strings.Repeat(`a:\`, n/3), "b": "e"})
		}},
	}
	for _, tc := range cases {
		work := func(n int) float64 {
			m := tc.input(n)
			_, err := tc.kf(m)
			require.NoError(t, err, tc.name)
			return allocPerCall(func() { _, _ = tc.kf(m) })
		}
		w1, w10 := work(45), work(450)
		if tc.name != "number" {
			w1, w10 = work(10_000), work(100_000)
		}
		require.Less(t, w10/w1, 25.0, "%s: 10x input costs %.0fx the work (%.0f vs %.0f bytes allocated)", tc.name, w10/w1, w10, w1)
	}
}

// An event time read as a Unix number went through big.Rat whatever its
// length: quadratic, 2.3 s for a million fraction digits. No Unix time needs
// more than 64 bytes (nanoseconds need 20 digits), so a longer one is
// refused from its length.
func TestEventTimeNumberRefusedByLength(t *testing.T) {
	t.Parallel()
	long := "1714557600." + strings.Repeat("7", 100_000)
	for _, tc := range []struct{ spec, payload, md string }{
		{"json:occurred_at", `{"occurred_at": ` + long + `}`, ""},
		{"metadata:event_time", `{}`, long},
	} {
		tf, err := framework.ParseTimeSpec(tc.spec)
		require.NoError(t, err)
		_, err = tf(msgWith(tc.payload, map[string]string{"event_time": tc.md}))
		require.ErrorAs(t, err, new(*framework.EventTimeError), tc.spec)
		require.True(t, framework.IsPermanent(err))
		require.ErrorContains(t, err, "longer than the limit")
	}
	// Full nanosecond precision still parses.
	tf, err := framework.ParseTimeSpec("json:occurred_at")
	require.NoError(t, err)
	at, err := tf(msgWith(`{"occurred_at": 1714557600.123456789}`, nil))
	require.NoError(t, err)
	require.Equal(t, int64(1714557600123456789), at.UnixNano())
}
