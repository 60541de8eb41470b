package console_test

import (
	"net/http"
	"net/url"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/framework/cmd/claimtx/internal/console"
)

// parkedEnv is a console whose consumer loyalty has order key customer-7
// parked: order 2 failed, 3 behind it.
func parkedEnv(t *testing.T, edit func(*console.Config)) *env {
	t.Helper()
	e := newEnv(t, edit)
	e.exec(`INSERT INTO processed_messages_parked_keys (consumer, order_key, reason) VALUES ('loyalty', 'customer-7', 'total_cents: <not a number>')`)
	e.exec(`INSERT INTO processed_messages_parked (consumer, order_key, message_key, uuid, payload, metadata, reason) VALUES
		('loyalty', 'customer-7', 'order-completed:2', 'u-2', '{"order_id": 2}', '{}', 'total_cents: <not a number>'),
		('loyalty', 'customer-7', 'order-completed:3', 'u-3', '{"order_id": 3}', '{}', NULL)`)
	return e
}

func (e *env) release(t *testing.T) (retryAt bool, skip bool, note string) {
	t.Helper()
	require.NoError(t, e.pool.QueryRow(t.Context(), `SELECT retry_at IS NOT NULL, skip_head, coalesce(request_note, '') FROM processed_messages_parked_keys`).Scan(&retryAt, &skip, &note))
	return retryAt, skip, note
}

func TestParkedPages(t *testing.T) {
	t.Parallel()
	e := parkedEnv(t, nil)
	require.Contains(t, e.ok("/"), "1 order keys parked</a> for loyalty (2 messages)")
	list := e.ok("/parked")
	require.Contains(t, list, "customer-7")
	require.Contains(t, list, "total_cents: &lt;not a number&gt;", "escaped")
	require.Contains(t, list, `href="/parked/key?consumer=loyalty&amp;key=customer-7"`)
	require.Contains(t, e.ok("/"), `href="/parked?consumer=loyalty"`)
	require.Contains(t, e.ok("/parked?consumer=loyalty"), "customer-7")
	other := e.ok("/parked?consumer=billing")
	require.NotContains(t, other, "customer-7")
	require.Contains(t, other, "No parked order keys.")

	page := e.ok("/parked/key?consumer=loyalty&key=customer-7")
	require.Contains(t, page, "order-completed:2")
	require.Contains(t, page, "behind the head")
	require.Contains(t, page, `{&#34;order_id&#34;: 3}`)
	csrf := csrfField.FindStringSubmatch(page)[1]

	form := url.Values{"consumer": {"loyalty"}, "key": {"customer-7"}, "note": {"n"}}
	for _, path := range []string{"/parked/retry", "/parked/skip"} {
		require.Equal(t, http.StatusForbidden, e.post(path, form).status, "%s without a CSRF token", path)
		form.Set("csrf", "not-the-token")
		require.Equal(t, http.StatusForbidden, e.post(path, form).status, "%s with a wrong CSRF token", path)
		form.Del("csrf")
	}
	form.Del("note")
	due, _, _ := e.release(t)
	require.False(t, due)

	form.Set("csrf", csrf)
	r := e.post("/parked/skip", form)
	require.Equal(t, http.StatusBadRequest, r.status, "a skip needs a note")
	r = e.post("/parked/retry", form)
	require.Equal(t, http.StatusSeeOther, r.status, r.body)
	due, skip, _ := e.release(t)
	require.True(t, due)
	require.False(t, skip)
	page = e.ok(r.header.Get("Location"))
	require.Contains(t, page, "Requested a retry")
	require.Contains(t, page, "retry requested by console")

	form.Set("note", "cancelled upstream")
	r = e.post("/parked/skip", form)
	require.Equal(t, http.StatusSeeOther, r.status, r.body)
	_, skip, note := e.release(t)
	require.True(t, skip)
	require.Equal(t, "cancelled upstream", note)

	form.Set("key", "customer-8")
	require.Equal(t, http.StatusNotFound, e.post("/parked/retry", form).status)
	require.Equal(t, http.StatusNotFound, e.get("/parked/key?consumer=loyalty&key=customer-8").status)
}

func TestParkedReadOnly(t *testing.T) {
	t.Parallel()
	e := parkedEnv(t, func(c *console.Config) { c.ReadOnly = true })
	page := e.ok("/parked/key?consumer=loyalty&key=customer-7")
	require.NotContains(t, page, "retry-form")
	require.NotContains(t, page, "skip-form")
	// Refused for being read-only, before the CSRF check.
	for _, path := range []string{"/parked/retry", "/parked/skip"} {
		r := e.post(path, url.Values{"consumer": {"loyalty"}, "key": {"customer-7"}, "note": {"n"}})
		require.Equal(t, http.StatusForbidden, r.status, path)
		require.Contains(t, r.body, "read-only", path)
	}
	due, _, _ := e.release(t)
	require.False(t, due)
}
