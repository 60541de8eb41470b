package framework_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/framework"
)

// Invalid UTF-8 in a JSON payload is refused, not repaired: encoding/json
// would turn every invalid byte into U+FFFD, so two different producer keys
// ("a\xffb", "a\xfeb") would claim the same key and the second event would
// be acked as a duplicate of the first: lost.
func TestPayloadKeyRefusesInvalidUTF8(t *testing.T) {
	t.Parallel()
	for _, spec := range []string{"json:id", "template:order:{payload.id}"} {
		kf, err := framework.ParseKeySpec(spec)
		require.NoError(t, err)
		for _, payload := range []string{"{\"id\": \"a\xffb\"}", "{\"id\": \"a\xfeb\"}", "{\"id\": 1, \"note\": \"\xc3\"}"} {
			_, err := kf(msgWith(payload, nil))
			require.ErrorAs(t, err, new(*framework.KeyError), "%s %q", spec, payload)
			require.ErrorContains(t, err, "not valid UTF-8")
			require.True(t, framework.IsPermanent(err))
		}
		// Valid UTF-8, including a real U+FFFD, still keys.
		k, err := kf(msgWith(`{"id": "a`+"\uFFFD"+`b"}`, nil))
		require.NoError(t, err, spec)
		require.Contains(t, k, "a\uFFFDb")
	}
}

// A \u escape of half a surrogate pair is valid JSON syntax, but
// encoding/json decodes it to U+FFFD, so "a\ud800b" and "a\udfffb" would
// share a key: refused like invalid UTF-8. Proper pairs and escaped
// backslashes key as before.
func TestPayloadKeyRefusesLoneSurrogates(t *testing.T) {
	t.Parallel()
	kf, err := framework.ParseKeySpec("json:id")
	require.NoError(t, err)
	for _, payload := range []string{
		`{"id": "a\ud800b"}`,
		`{"id": "a\udfffb"}`,
		`{"id": "\ud800\u0041"}`,
		`{"id": "\udc00\ud800"}`,
		`{"id": "x", "note": "\ud800"}`,
		`{"\udbff": 1, "id": "x"}`,
		`{"id": "\ud800`,
	} {
		_, err := kf(msgWith(payload, nil))
		require.ErrorAs(t, err, new(*framework.KeyError), payload)
		require.True(t, framework.IsPermanent(err))
		if payload != `{"id": "\ud800` {
			require.ErrorContains(t, err, "unpaired UTF-16 surrogate", payload)
		}
	}
	for payload, want := range map[string]string{
		`{"id": "\ud83d\ude00"}`:         "\U0001F600",
		`{"id": "\uD83D\uDE00x"}`:        "\U0001F600x",
		`{"id": "\\ud800"}`:              `\ud800`,
		`{"id": "\"\ud83d\ude00\\\\"}`:   "\"\U0001F600\\\\",
		`{"id": "\u00e9", "n": "\\\""}`:  "\u00e9",
		`{"id": "a", "note": "\\udfff"}`: "a",
	} {
		k, err := kf(msgWith(payload, nil))
		require.NoError(t, err, payload)
		require.Equal(t, want, k, payload)
	}
}
