package console_test

import (
	"context"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/framework/cmd/claimtx/internal/console"
)

const (
	xssKey    = `<script>alert(1)</script>`
	xssAttr   = `"><img src=x onerror=alert(1)>`
	escScript = `&lt;script&gt;alert(1)&lt;/script&gt;`
)

// seedLookup writes, in one transaction, a claim of loyalty and two
// outbox rows; and a poison memo for key "memo:1".
func seedLookup(t *testing.T, e *env) {
	t.Helper()
	ctx := context.Background()
	claims := pgx.Identifier{e.schema, "processed_messages"}.Sanitize()
	outbox := pgx.Identifier{e.schema, "outbox"}.Sanitize()
	memo := pgx.Identifier{e.schema, "processed_messages_poison_memo"}.Sanitize()
	require.NoError(t, pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO `+claims+` (consumer, message_key, payload_hash) VALUES ('loyalty', 'order:1', '\x01')`); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO `+outbox+` (topic, uuid, idempotency_key, payload, sent_at) VALUES ('points', 'u1', 'i1', 'x', now()), ('points', 'u2', 'i2', 'y', NULL)`)
		return err
	}))
	e.exec(`INSERT INTO `+claims+` (consumer, message_key) VALUES ('loyalty', $1), ('loyalty', $2)`, xssKey, xssAttr)
	e.exec(`INSERT INTO `+memo+` (consumer, message_key, reason, seen) VALUES ('loyalty', 'memo:1', $1, 3), ('loyalty', $2, 'bad', 1)`, "cannot decode "+xssKey, xssAttr)
}

// The look-up shows the claim, its transaction's outbox rows and the poison
// memo, or says there is nothing; producer data is escaped.
func TestLookup(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	seedLookup(t, e)

	body := e.ok("/lookup")
	require.Contains(t, body, "<h1>Look up a key</h1>")
	require.Contains(t, body, `<option value="loyalty">loyalty</option>`)
	require.Contains(t, body, `>Look up</button>`)
	require.NotContains(t, body, `id="report"`)
	require.Contains(t, body, "--consumer-config", "paste-a-message needs a configuration")

	body = e.ok("/lookup?consumer=loyalty&key=order:1")
	require.Contains(t, body, `<section id="report">`)
	require.Contains(t, body, `id="claim"`)
	require.Contains(t, body, "recorded")
	require.Contains(t, body, `<table id="outbox">`)
	require.Equal(t, 2, strings.Count(body, "<td>points</td>"))
	require.Contains(t, body, "<td>sent</td>")
	require.Contains(t, body, "<td>pending</td>")
	require.NotContains(t, body, "Clear poison memo")

	body = e.ok("/lookup?consumer=loyalty&key=never")
	require.Contains(t, body, "No claim, no poison memo: never applied by this consumer, or removed by retention")

	body = e.ok("/lookup?consumer=loyalty&key=memo:1")
	require.Contains(t, body, `id="memo"`)
	require.Contains(t, body, "cannot decode "+escScript)
	require.Contains(t, body, "<dd>3</dd>")
	require.Contains(t, body, "Clear poison memo")

	// Producer data is escaped everywhere: in text and in attributes.
	for _, key := range []string{xssKey, xssAttr} {
		body = e.ok("/lookup?" + url.Values{"consumer": {"loyalty"}, "key": {key}}.Encode())
		require.NotContains(t, body, key)
		require.NotContains(t, body, "<img")
		require.NotContains(t, body, "<script")
		require.Contains(t, body, `id="claim"`)
	}
	require.Contains(t, body, "&#34;&gt;&lt;img src=x onerror=alert(1)&gt;")
}

// Clearing a poison memo is a POST with the CSRF token, refused
// cross-site, refused read-only; a GET changes nothing.
func TestClearMemoCSRF(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	seedLookup(t, e)
	page := "/lookup?consumer=loyalty&key=memo:1"
	csrf := csrfField.FindStringSubmatch(e.ok(page))[1]
	form := func(token string) url.Values {
		v := url.Values{"consumer": {"loyalty"}, "key": {"memo:1"}}
		if token != "" {
			v.Set("csrf", token)
		}
		return v
	}
	require.Equal(t, http.StatusMethodNotAllowed, e.get("/poison-memo/clear?consumer=loyalty&key=memo:1").status)
	require.Equal(t, http.StatusForbidden, e.post("/poison-memo/clear", form("")).status)
	require.Equal(t, http.StatusForbidden, e.post("/poison-memo/clear", form("AAAA"+csrf[4:])).status)
	require.Equal(t, http.StatusForbidden, e.post("/poison-memo/clear", form(csrf), "Sec-Fetch-Site", "cross-site").status)
	require.Equal(t, http.StatusForbidden, e.post("/poison-memo/clear", form(csrf), "Origin", "https://evil.example").status)
	require.Contains(t, e.ok(page), `id="memo"`, "still there")

	r := e.post("/poison-memo/clear", form(csrf), "Sec-Fetch-Site", "same-origin")
	require.Equal(t, http.StatusSeeOther, r.status, r.body)
	require.Equal(t, "/lookup?cleared=1&consumer=loyalty&key=memo%3A1", r.header.Get("Location"))
	body := e.ok(r.header.Get("Location"))
	require.Contains(t, body, "Poison memo cleared")
	require.NotContains(t, body, `id="memo"`)

	// Another console process: its token is not this one's.
	other := newEnvOn(t, e.pool, e.schema, nil)
	require.Equal(t, http.StatusForbidden, other.post("/poison-memo/clear", url.Values{"consumer": {"loyalty"}, "key": {xssAttr}, "csrf": {csrf}}).status)
}

// Read-only: no clear button, and the POST is refused.
func TestReadOnlyLookup(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *console.Config) {
		c.ReadOnly = true
		c.Consumers = []console.Consumer{{Name: "loyalty", Topic: "orders", Key: "json:order_id"}}
	})
	seedLookup(t, e)
	body := e.ok("/lookup?consumer=loyalty&key=memo:1")
	require.Contains(t, body, `id="memo"`)
	require.NotContains(t, body, "Clear poison memo")
	require.Contains(t, body, "read-only")
	csrf := csrfField.FindStringSubmatch(body)
	require.NotNil(t, csrf, "the paste form is still there")
	r := e.post("/poison-memo/clear", url.Values{"consumer": {"loyalty"}, "key": {"memo:1"}, "csrf": {csrf[1]}})
	require.Equal(t, http.StatusForbidden, r.status)
	require.Contains(t, r.body, "read-only")
	require.Contains(t, e.ok("/lookup?consumer=loyalty&key=memo:1"), `id="memo"`)
}

// Paste a message: the key comes from the consumer's key spec and policy.
func TestPasteMessage(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *console.Config) {
		c.Consumers = []console.Consumer{
			{Name: "loyalty", Topic: "orders", Key: "template:order:{payload.order_id}"},
			{Name: "audit", Topic: "orders", Key: "metadata:event_id"},
		}
	})
	seedLookup(t, e)
	body := e.ok("/lookup")
	require.Contains(t, body, `id="paste-form"`)
	csrf := csrfField.FindStringSubmatch(body)[1]

	r := e.post("/lookup", url.Values{"csrf": {csrf}, "consumer": {"loyalty"}, "payload": {`{"order_id": 1}`}})
	require.Equal(t, http.StatusOK, r.status, r.body)
	require.Contains(t, r.body, `<code id="derived-key">order:1</code>`)
	require.Contains(t, r.body, `id="claim"`)

	r = e.post("/lookup", url.Values{"csrf": {csrf}, "consumer": {"audit"}, "payload": {"x"}, "metadata": {"event_id: evt-9\ntraceparent: 00-aa"}})
	require.Equal(t, http.StatusOK, r.status, r.body)
	require.Contains(t, r.body, `<code id="derived-key">evt-9</code>`)
	require.Contains(t, r.body, "No claim, no poison memo")

	r = e.post("/lookup", url.Values{"csrf": {csrf}, "consumer": {"loyalty"}, "payload": {`{"order": "seven"}`}})
	require.Equal(t, http.StatusOK, r.status)
	require.Contains(t, r.body, `id="paste-error"`)
	require.Contains(t, r.body, "no key with the key spec template:order:{payload.order_id}")

	r = e.post("/lookup", url.Values{"csrf": {csrf}, "consumer": {"audit"}, "metadata": {"no colon here"}})
	require.Equal(t, http.StatusBadRequest, r.status)
	require.Contains(t, r.body, "metadata line 1")

	r = e.post("/lookup", url.Values{"csrf": {csrf}, "consumer": {"nobody"}, "payload": {"x"}})
	require.Equal(t, http.StatusBadRequest, r.status)

	big := strings.Repeat("a", 1<<20+1)
	r = e.post("/lookup", url.Values{"csrf": {csrf}, "consumer": {"loyalty"}, "payload": {big}})
	require.Equal(t, http.StatusRequestEntityTooLarge, r.status)
	require.Contains(t, r.body, "at most 1 MiB")
	r = e.post("/lookup", url.Values{"csrf": {csrf}, "consumer": {"loyalty"}, "payload": {big + big}})
	require.Equal(t, http.StatusRequestEntityTooLarge, r.status)
	require.Contains(t, r.body, "1 MiB")
}
