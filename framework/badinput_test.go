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
			require.ErrorIs(t, err, framework.ErrInvalidKey, "%s %q", spec, payload)
			require.ErrorContains(t, err, "not valid UTF-8")
			require.True(t, framework.IsPermanent(err))
		}
		// Valid UTF-8, including a real U+FFFD, still keys.
		k, err := kf(msgWith(`{"id": "a`+"\uFFFD"+`b"}`, nil))
		require.NoError(t, err, spec)
		require.Contains(t, k, "a\uFFFDb")
	}
}
