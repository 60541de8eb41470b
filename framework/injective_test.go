package framework_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/framework"
)

// Two distinct events with one key lose the second: it is acked as a
// duplicate. These are the collisions the templates used to produce.
func TestTemplateSeparatorInValue(t *testing.T) {
	t.Parallel()
	kf, err := framework.ParseKeySpec("template:{metadata.tenant}:{metadata.event_id}")
	require.NoError(t, err)
	key := func(tenant, event string) string {
		k, err := kf(msgWith("", map[string]string{"tenant": tenant, "event_id": event}))
		require.NoError(t, err)
		return k
	}
	require.NotEqual(t, key("a:b", "c"), key("a", "b:c"))
	require.NotEqual(t, key(`a\`, "b"), key("a", `\b`))
	require.NotEqual(t, key(`a\:`, "b"), key(`a\`, ":b"))
	// Values without the separator or the escape character key as before,
	// so claims made before the escaping keep matching.
	require.Equal(t, "acme:e9", key("acme", "e9"))
	require.Equal(t, "a-b/c:d:e", key("a-b/c", "d:e"), "the last value needs no escaping")
	require.Equal(t, `a\:b:c`, key("a:b", "c"))
	require.Equal(t, `a\\:b`, key(`a\`, "b"))
}

func TestTemplateAdjacentPlaceholdersRefused(t *testing.T) {
	t.Parallel()
	for _, spec := range []string{
		"template:{payload.a}{payload.b}",
		"template:x:{metadata.a}{payload.b}:y",
		`template:{metadata.a}\{metadata.b}`,
	} {
		_, err := framework.ParseKeySpec(spec)
		var ce *framework.ConfigError
		require.ErrorAs(t, err, &ce, spec)
		require.Equal(t, "key", ce.Field)
	}
	// A literal brace is a separator like any other.
	kf, err := framework.ParseKeySpec("template:{payload.a}{{{payload.b}")
	require.NoError(t, err)
	k1, err := kf(msgWith(`{"a": "x{", "b": "y"}`, nil))
	require.NoError(t, err)
	k2, err := kf(msgWith(`{"a": "x", "b": "{y"}`, nil))
	require.NoError(t, err)
	require.NotEqual(t, k1, k2)
	require.Equal(t, `x\{{y`, k1)
}

// first: (FirstNonEmpty before) used to give event_id "3" and, for a
// message without one, order_id 3 the same key.
func TestFirstNonEmptyNamespacesSources(t *testing.T) {
	t.Parallel()
	first, err := framework.ParseKeySpec("first:metadata:event_id|json:order_id")
	require.NoError(t, err)
	key := func(payload string, md map[string]string) string {
		k, err := first(msgWith(payload, md))
		require.NoError(t, err)
		return k
	}
	fromEvent := key(`{}`, map[string]string{"event_id": "3"})
	fromOrder := key(`{"order_id": 3}`, nil)
	require.NotEqual(t, fromEvent, fromOrder)
	require.Equal(t, "3", fromEvent, "the first source keys as before")
	require.Equal(t, `\1:3`, fromOrder)
	// The first source cannot imitate a later one.
	require.NotEqual(t, fromOrder, key(`{}`, map[string]string{"event_id": `\1:3`}))
	require.Equal(t, `\0:\1:3`, key(`{}`, map[string]string{"event_id": `\1:3`}))
}
