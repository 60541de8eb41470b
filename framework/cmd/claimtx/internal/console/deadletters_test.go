package console_test

import (
	"context"
	"errors"
	"fmt"
	"html"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/brokers"
	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/framework/cmd/claimtx/internal/console"
	"github.com/claimtx/claimtx/framework/cmd/claimtx/internal/dlq"
	"github.com/claimtx/claimtx/framework/cmd/claimtx/internal/dlq/dlqtest"
)

const dlqKeySpec = "template:order:{payload.order_id}"

// dlqEnv is a console whose consumer "loyalty" has its poison destination
// in w.
func dlqEnv(t *testing.T, w *dlqtest.World, edit func(*console.Config)) *env {
	t.Helper()
	return newEnvOn(t, w.Pool, w.Schema, func(c *console.Config) {
		c.Consumers = []console.Consumer{{Name: "loyalty", Topic: w.Topic, Key: dlqKeySpec, Broker: w.Broker}}
		if edit != nil {
			edit(c)
		}
	})
}

// letterRows maps each letter row's data-id to its data-class.
func letterRows(t *testing.T, body string) map[string]string {
	t.Helper()
	out := map[string]string{}
	re := regexp.MustCompile(`(?s)<tr data-id="([^"]*)">.*?data-class="([^"]*)"`)
	for _, m := range re.FindAllStringSubmatch(body, -1) {
		out[m[1]] = m[2]
	}
	return out
}

var jobLocation = regexp.MustCompile(`^/jobs/[0-9a-f]{16}$`)

// awaitJob reloads the job page until it is no longer running.
func (e *env) awaitJob(path string) string {
	e.t.Helper()
	var body string
	require.Eventually(e.t, func() bool {
		body = e.ok(path)
		return !strings.Contains(body, `<p id="job-status" class="">running</p>`)
	}, 60*time.Second, 50*time.Millisecond)
	return body
}

// Dead letters on both brokers: the classified list, filters, a dry-run
// preview, a replay job of the selected letter, which arrives on the topic
// exactly once.
func TestDeadLettersPreviewReplay(t *testing.T) {
	dlqtest.EachBroker(t, 1, func(t *testing.T, w *dlqtest.World) {
		orders := dlqtest.Orders(1, 6)
		bad := dlqtest.Order(7)
		bad.Payload = []byte(`{"order": "seven"}`)
		copies := w.Poisoned("loyalty", dlqKeySpec, framework.Permanent(errors.New("cannot decode: schema v2")), append(orders, bad)...)
		xss := dlqtest.Order(9)
		xss.Payload = []byte(`{"order_id": "<script>alert(1)</script>"}`)
		copies = append(copies, w.Poisoned("loyalty", dlqKeySpec, errors.New(xssAttr), xss)...)
		copies = append(copies, w.Poisoned("analytics", dlqKeySpec, errors.New("handler timeout"), dlqtest.Order(8))...)
		w.Publish(w.Poison, copies...)
		w.Claim("loyalty", "order:1", dlq.Fingerprint(orders[0].Payload))
		w.Claim("loyalty", "order:2", dlq.Fingerprint([]byte("another payload")))
		e := dlqEnv(t, w, nil)

		body := e.ok("/dead-letters")
		require.Contains(t, body, "<h1>Dead letters</h1>")
		require.Contains(t, body, `<table id="letters">`)
		require.Equal(t, map[string]string{
			"order-1": "already-applied", "order-2": "already-applied", "order-3": "would-apply", "order-4": "would-apply",
			"order-5": "would-apply", "order-6": "would-apply", "order-7": "still-bad", "order-9": "would-apply",
		}, letterRows(t, body), "analytics' copy is not loyalty's")
		require.Contains(t, body, `data-class="already-applied" class="class-already-applied">already applied (DIFFERENT payload)</td>`)
		require.Contains(t, body, `data-class="already-applied" class="class-already-applied">already applied</td>`)
		require.Contains(t, body, `>would apply</td>`)
		require.Contains(t, body, `>still bad</td>`)
		require.Contains(t, body, `<input type="checkbox" name="id" value="order-3"`)
		require.Contains(t, body, "Preview replay of selected")
		require.Contains(t, body, "Preview replay of all matching")
		// Producer data in a key and a reason is escaped.
		require.NotContains(t, body, "<script>alert(1)</script>")
		require.NotContains(t, body, "<img src=x")
		require.Contains(t, body, "order:"+escScript)
		require.Contains(t, body, "&#34;&gt;&lt;img src=x onerror=alert(1)&gt;")
		require.Contains(t, body, "<pre>{&#34;order_id&#34;: 3, &#34;customer_id&#34;: 3, &#34;total_cents&#34;: 1000}</pre>")
		require.Len(t, w.Read(w.Poison), 9, "browsing consumed nothing")

		require.Len(t, letterRows(t, e.ok("/dead-letters?consumer=loyalty&reason=schema+v2")), 7)
		require.Equal(t, map[string]string{"order-5": "would-apply"}, letterRows(t, e.ok("/dead-letters?consumer=loyalty&key=order:5")))
		require.Contains(t, e.ok("/dead-letters?consumer=loyalty&older=1h"), "No dead letters match the filters")
		r := e.get("/dead-letters?consumer=loyalty&older=a+while")
		require.Equal(t, http.StatusBadRequest, r.status)
		require.Contains(t, r.body, "not a duration")

		// Preview: order-3 would be replayed, order-1 passed.
		csrf := csrfField.FindStringSubmatch(body)[1]
		sel := url.Values{"csrf": {csrf}, "consumer": {"loyalty"}, "scope": {"selected"}, "id": {"order-1", "order-3"}}
		r = e.post("/dead-letters/preview", sel)
		require.Equal(t, http.StatusOK, r.status, r.body)
		require.Contains(t, r.body, "<h1>Replay preview</h1>")
		require.Equal(t, map[string]string{"order-1": "already-applied", "order-3": "would-apply"}, letterRows(t, r.body))
		require.Contains(t, r.body, `<td data-action="replay">replay</td>`)
		require.Contains(t, r.body, `<td data-action="pass">pass: already applied`)
		require.Contains(t, r.body, "Replay 1 letters")
		require.Contains(t, r.body, `<input type="hidden" name="id" value="order-3">`)
		sel.Set("include_applied", "1")
		require.Contains(t, e.post("/dead-letters/preview", sel).body, "Replay 2 letters")
		sel.Del("include_applied")
		r = e.post("/dead-letters/preview", url.Values{"csrf": {csrf}, "consumer": {"loyalty"}, "scope": {"all"}, "reason": {"schema v2"}})
		require.Equal(t, http.StatusSeeOther, r.status, "a preview of all matching is a job: %s", r.body)
		all := e.awaitJob(r.header.Get("Location"))
		require.Contains(t, all, "Replay 4 letters")
		require.Len(t, letterRows(t, all), 7)
		require.Len(t, w.Read(w.Poison), 9, "a preview changes nothing")
		require.Zero(t, w.Depth(w.Topic))
		r = e.post("/dead-letters/preview", url.Values{"csrf": {csrf}, "consumer": {"loyalty"}, "scope": {"selected"}})
		require.Equal(t, http.StatusBadRequest, r.status)

		// Replay order-3.
		r = e.post("/dead-letters/replay", url.Values{"csrf": {csrf}, "consumer": {"loyalty"}, "scope": {"selected"}, "id": {"order-3"}})
		require.Equal(t, http.StatusSeeOther, r.status, r.body)
		loc := r.header.Get("Location")
		require.Regexp(t, jobLocation, loc)
		body = e.awaitJob(loc)
		require.Contains(t, body, "<h1>Replay</h1>")
		require.Contains(t, body, `<p id="job-status" class="">done</p>`)
		require.NotContains(t, body, `http-equiv="refresh"`)
		require.Contains(t, body, `<td class="num" id="replayed">1</td>`)
		require.Regexp(t, `(?s)<tr data-id="order-3">.*?data-result="replayed"`, body)
		topic := w.Read(w.Topic)
		require.Len(t, topic, 1, "exactly once")
		require.Equal(t, "order-3", topic[0].UUID)
		require.Equal(t, "evt-3", topic[0].Metadata.Get("event_id"))
		if w.Kind != brokers.KindKafka {
			require.Len(t, w.Read(w.Poison), 8, "removed from the poison queue")
			require.NotContains(t, letterRows(t, e.ok("/dead-letters")), "order-3")
		}
	})
}

// A page reads at most page × 50 matching letters (in batches) and at
// most the scan cap, and says so when the cap cut it short.
func TestDeadLettersPaging(t *testing.T) {
	t.Parallel()
	w := dlqtest.New(t, brokers.KindAMQP, 1)
	orders := dlqtest.Orders(1, 300)
	w.Publish(w.Poison, w.Poisoned("loyalty", dlqKeySpec, errors.New("boom"), orders...)...)
	e := dlqEnv(t, w, func(c *console.Config) { c.ScanCap = 250 })

	ids := func(body string) []string {
		var out []string
		for _, m := range regexp.MustCompile(`<tr data-id="([^"]*)">`).FindAllStringSubmatch(body, -1) {
			out = append(out, m[1])
		}
		return out
	}
	body := e.ok("/dead-letters?consumer=loyalty")
	got := ids(body)
	require.Len(t, got, 50)
	require.Equal(t, "order-1", got[0])
	require.Equal(t, "order-50", got[49])
	require.Contains(t, body, "Read 100 of 300 letters", "stops after the batch holding the 51st")
	require.Contains(t, body, `rel="next"`)
	require.NotContains(t, body, `rel="prev"`)

	body = e.ok("/dead-letters?consumer=loyalty&page=2")
	got = ids(body)
	require.Equal(t, "order-51", got[0])
	require.Len(t, got, 50)

	body = e.ok("/dead-letters?consumer=loyalty&page=4")
	got = ids(body)
	require.Len(t, got, 50)
	require.Equal(t, "order-151", got[0])
	require.NotContains(t, body, "narrow the filters", "the page is whole")
	require.Contains(t, body, `<a href="/dead-letters?consumer=loyalty&amp;page=5" rel="next">`)

	// Page 5 needs the 251st letter to know whether a page 6 exists: the
	// cap stops it, and the page says so.
	body = e.ok("/dead-letters?consumer=loyalty&page=5")
	got = ids(body)
	require.Len(t, got, 50)
	require.Equal(t, "order-201", got[0])
	require.Contains(t, body, "Scanned 250 of 300; narrow the filters.")

	body = e.ok("/dead-letters?consumer=loyalty&page=6")
	require.Empty(t, ids(body))
	require.Contains(t, body, "Scanned 250 of 300; narrow the filters.")
	require.Equal(t, 300, w.Depth(w.Poison), "all requeued")
}

// Read-only: the preview is there (it changes nothing), the confirmation
// is not, and the replay POST is refused.
func TestDeadLettersReadOnly(t *testing.T) {
	t.Parallel()
	w := dlqtest.New(t, brokers.KindAMQP, 1)
	w.Publish(w.Poison, w.Poisoned("loyalty", dlqKeySpec, errors.New("boom"), dlqtest.Order(1))...)
	e := dlqEnv(t, w, func(c *console.Config) { c.ReadOnly = true })
	body := e.ok("/dead-letters")
	require.Contains(t, body, "Preview replay of selected")
	csrf := csrfField.FindStringSubmatch(body)[1]
	sel := url.Values{"csrf": {csrf}, "consumer": {"loyalty"}, "scope": {"selected"}, "id": {"order-1"}}
	r := e.post("/dead-letters/preview", sel)
	require.Equal(t, http.StatusOK, r.status)
	require.Contains(t, r.body, `data-action="replay"`)
	require.NotContains(t, r.body, "Replay 1 letters")
	require.NotContains(t, r.body, `action="/dead-letters/replay"`)
	r = e.post("/dead-letters/replay", sel)
	require.Equal(t, http.StatusForbidden, r.status)
	require.Equal(t, 1, w.Depth(w.Poison))
	require.Zero(t, w.Depth(w.Topic))
}

// No page shows a password or a connection string, even in errors.
func TestNoSecretsRendered(t *testing.T) {
	t.Parallel()
	const pw = "s3cr3t-pw-Zq9"
	amqpURL := "amqp://guest:" + pw + "@127.0.0.1:1/"
	dbURL := "postgres://app:" + pw + "@db.internal:5432/app"
	w := dlqtest.New(t, brokers.KindAMQP, 1)
	e := newEnvOn(t, w.Pool, w.Schema, func(c *console.Config) {
		var amqp, kafka brokers.Config
		amqp.AMQP.URL = amqpURL
		kafka.Kind = brokers.KindKafka
		kafka.Kafka.Brokers = []string{"127.0.0.1:1"}
		kafka.Kafka.SASL.Mechanism = "PLAIN"
		kafka.Kafka.SASL.User = "app"
		kafka.Kafka.SASL.Password = pw
		c.Consumers = []console.Consumer{
			{Name: "loyalty", Topic: "orders", Key: dlqKeySpec, Broker: amqp},
			{Name: "billing", Topic: "invoices", Key: dlqKeySpec, Broker: kafka},
		}
		c.Secrets = []string{amqpURL, dbURL, pw}
		c.QueryTimeout = 2 * time.Second
	})
	w.Claim("loyalty", "order:1", nil)
	csrf := csrfField.FindStringSubmatch(e.ok("/lookup"))[1]
	var bodies []string
	for _, p := range []string{"/", "/lookup", "/lookup?consumer=loyalty&key=order:1", "/dead-letters?consumer=loyalty", "/dead-letters?consumer=billing", "/jobs/nope"} {
		bodies = append(bodies, e.get(p).body)
	}
	for _, consumer := range []string{"loyalty", "billing"} {
		sel := url.Values{"csrf": {csrf}, "consumer": {consumer}, "scope": {"selected"}, "id": {"x"}}
		bodies = append(bodies, e.post("/dead-letters/preview", sel).body, e.post("/dead-letters/replay", sel).body)
	}
	bodies = append(bodies, e.post("/lookup", url.Values{"csrf": {csrf}, "consumer": {"loyalty"}, "payload": {"{}"}}).body)
	for i, b := range bodies {
		require.NotContains(t, b, pw, "page %d", i)
		require.NotContains(t, b, "amqp://", "page %d", i)
		require.NotContains(t, b, "postgres://", "page %d", i)
		require.NotContains(t, b, "db.internal", "page %d", i)
	}
	require.Contains(t, strings.Join(bodies, ""), "opening orders.poison", "the broker errors are shown, redacted")
}

// One replay at a time per consumer: a second one is a 409 while the
// first runs; the page refreshes itself while it runs.
func TestReplayConflict(t *testing.T) {
	t.Parallel()
	w := dlqtest.New(t, brokers.KindAMQP, 1)
	w.Publish(w.Poison, w.Poisoned("loyalty", dlqKeySpec, errors.New("boom"), dlqtest.Order(1), dlqtest.Order(2), dlqtest.Order(3))...)
	// At one letter a second, the job waits ~3 s after its only batch.
	e := dlqEnv(t, w, func(c *console.Config) { c.ReplayRate = 1 })
	csrf := csrfField.FindStringSubmatch(e.ok("/dead-letters"))[1]
	all := url.Values{"csrf": {csrf}, "consumer": {"loyalty"}, "scope": {"all"}}
	r := e.post("/dead-letters/replay", all)
	require.Equal(t, http.StatusSeeOther, r.status)
	loc := r.header.Get("Location")
	body := e.ok(loc)
	require.Contains(t, body, `<p id="job-status" class="">running</p>`)
	require.Contains(t, body, `<meta http-equiv="refresh" content="1">`)
	require.Contains(t, body, "<progress")
	r = e.post("/dead-letters/replay", all)
	require.Equal(t, http.StatusConflict, r.status)
	require.Contains(t, r.body, "running already")
	body = e.awaitJob(loc)
	require.Contains(t, body, `<p id="job-status" class="">done</p>`)
	require.Len(t, w.Read(w.Topic), 3)
	require.Equal(t, http.StatusNotFound, e.get("/jobs/0000000000000000").status)
	// The next one may start.
	r = e.post("/dead-letters/replay", all)
	require.Equal(t, http.StatusSeeOther, r.status)
	require.Contains(t, e.awaitJob(r.header.Get("Location")), `<td class="num" id="replayed">0</td>`)
}

var (
	confirmForm = regexp.MustCompile(`(?s)<form method="post" action="/dead-letters/replay" class="actions" id="confirm">(.*?)</form>`)
	hiddenField = regexp.MustCompile(`<input type="hidden" name="([^"]+)" value="([^"]*)">`)
)

// confirmFields returns the fields of the preview's confirmation form, as
// a browser would post them; nil when the page has none.
func confirmFields(body string) url.Values {
	m := confirmForm.FindStringSubmatch(body)
	if m == nil {
		return nil
	}
	v := url.Values{}
	for _, f := range hiddenField.FindAllStringSubmatch(m[1], -1) {
		v.Add(f[1], html.UnescapeString(f[2]))
	}
	return v
}

// seedPreviewAll poisons orders 1-6 ("schema v2"; 1 and 2 already
// applied), 7 (still bad), 10 (another reason: filtered out) and
// analytics' copy of 8: the would-apply letters matching the reason are
// 3, 4, 5 and 6.
func seedPreviewAll(w *dlqtest.World) {
	orders := dlqtest.Orders(1, 6)
	bad := dlqtest.Order(7)
	bad.Payload = []byte(`{"order": "seven"}`)
	copies := w.Poisoned("loyalty", dlqKeySpec, framework.Permanent(errors.New("cannot decode: schema v2")), append(orders, bad)...)
	copies = append(copies, w.Poisoned("loyalty", dlqKeySpec, errors.New("handler timeout"), dlqtest.Order(10))...)
	copies = append(copies, w.Poisoned("analytics", dlqKeySpec, errors.New("cannot decode: schema v2"), dlqtest.Order(8))...)
	w.Publish(w.Poison, copies...)
	w.Claim("loyalty", "order:1", dlq.Fingerprint(orders[0].Payload))
	w.Claim("loyalty", "order:2", nil)
}

// The preview of all matching letters is a dry-run job: the POST
// redirects to it, it reaches done with the totals of the whole
// destination, and its confirmation replays exactly the would-apply
// letters the filters match.
func TestPreviewAllJob(t *testing.T) {
	dlqtest.EachBroker(t, 2, func(t *testing.T, w *dlqtest.World) {
		seedPreviewAll(w)
		e := dlqEnv(t, w, nil)
		csrf := csrfField.FindStringSubmatch(e.ok("/dead-letters"))[1]

		r := e.post("/dead-letters/preview", url.Values{"csrf": {csrf}, "consumer": {"loyalty"}, "scope": {"all"}, "reason": {"schema v2"}})
		require.Equal(t, http.StatusSeeOther, r.status, r.body)
		loc := r.header.Get("Location")
		require.Regexp(t, jobLocation, loc)
		body := e.awaitJob(loc)
		require.Contains(t, body, "<h1>Replay preview</h1>")
		require.Contains(t, body, `<p id="job-status" class="">done</p>`)
		require.NotContains(t, body, `http-equiv="refresh"`)
		require.Contains(t, body, `<span id="job-count">9 of 9</span>`)
		require.Equal(t, map[string]string{
			"order-1": "already-applied", "order-2": "already-applied", "order-3": "would-apply", "order-4": "would-apply",
			"order-5": "would-apply", "order-6": "would-apply", "order-7": "still-bad",
		}, letterRows(t, body), "the reason filter leaves order-10 out, the consumer check analytics' order-8")
		require.Contains(t, body, `<tr><th>Read</th><td class="num">9</td></tr>`)
		require.Contains(t, body, `<tr><th>Selected</th><td class="num">7</td></tr>`)
		require.Contains(t, body, `<tr><th>Would apply</th><td class="num">4</td></tr>`)
		require.Contains(t, body, `<td class="num" id="would-replay">4</td>`)
		require.Contains(t, body, `<td data-action="pass">pass: already applied`)
		require.Contains(t, body, "Replay 4 letters")
		require.Len(t, w.Read(w.Poison), 9, "a dry run changes nothing")
		require.Zero(t, w.Depth(w.Topic))

		confirm := confirmFields(body)
		require.NotNil(t, confirm, "a confirmation form")
		require.Equal(t, csrf, confirm.Get("csrf"))
		require.Equal(t, "all", confirm.Get("scope"))
		require.Equal(t, "schema v2", confirm.Get("reason"))
		r = e.post("/dead-letters/replay", confirm)
		require.Equal(t, http.StatusSeeOther, r.status, r.body)
		body = e.awaitJob(r.header.Get("Location"))
		require.Contains(t, body, "<h1>Replay</h1>")
		require.Contains(t, body, `<p id="job-status" class="">done</p>`)
		require.Contains(t, body, `<td class="num" id="replayed">4</td>`)
		var got []string
		for _, m := range w.Read(w.Topic) {
			got = append(got, m.UUID)
		}
		slices.Sort(got)
		require.Equal(t, []string{"order-3", "order-4", "order-5", "order-6"}, got, "exactly the would-apply letters, once each")
		if w.Kind != brokers.KindKafka {
			require.Len(t, w.Read(w.Poison), 5, "the replayed letters left the poison queue")
		}
	})
}

// Read-only: the dry-run job runs (it changes nothing) and its page has
// no confirmation.
func TestPreviewAllJobReadOnly(t *testing.T) {
	t.Parallel()
	w := dlqtest.New(t, brokers.KindAMQP, 1)
	seedPreviewAll(w)
	e := dlqEnv(t, w, func(c *console.Config) { c.ReadOnly = true })
	csrf := csrfField.FindStringSubmatch(e.ok("/dead-letters"))[1]
	r := e.post("/dead-letters/preview", url.Values{"csrf": {csrf}, "consumer": {"loyalty"}, "scope": {"all"}})
	require.Equal(t, http.StatusSeeOther, r.status, r.body)
	body := e.awaitJob(r.header.Get("Location"))
	require.Contains(t, body, `<p id="job-status" class="">done</p>`)
	require.Contains(t, body, `<td class="num" id="would-replay">5</td>`, "orders 3-6 and 10")
	require.Contains(t, body, `data-action="replay"`)
	require.NotContains(t, body, "Replay 5 letters")
	require.NotContains(t, body, `action="/dead-letters/replay"`)
	require.Nil(t, confirmFields(body))
	require.Equal(t, 9, w.Depth(w.Poison))
	require.Zero(t, w.Depth(w.Topic))
}

// A dry-run job shares the one-job-per-consumer rule with replays (the
// same dry run asked again joins the running one), and Console.Close
// cancels it. The claim table is locked, so the job stays in its first
// classification until Close cancels it.
func TestPreviewAllJobClose(t *testing.T) {
	t.Parallel()
	w := dlqtest.New(t, brokers.KindAMQP, 1)
	seedPreviewAll(w)
	e := dlqEnv(t, w, nil)
	csrf := csrfField.FindStringSubmatch(e.ok("/dead-letters"))[1]

	ctx := context.Background()
	tx, err := w.Pool.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(ctx) })
	_, err = tx.Exec(ctx, fmt.Sprintf(`LOCK TABLE %q.processed_messages IN ACCESS EXCLUSIVE MODE`, w.Schema))
	require.NoError(t, err)

	all := url.Values{"csrf": {csrf}, "consumer": {"loyalty"}, "scope": {"all"}}
	r := e.post("/dead-letters/preview", all)
	require.Equal(t, http.StatusSeeOther, r.status, r.body)
	loc := r.header.Get("Location")
	// The job is inside its run: its claims query waits for the lock.
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, w.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
WHERE wait_event_type = 'Lock' AND query LIKE '%' || $1 || '%processed_messages%' AND query NOT LIKE '%pg_stat_activity%'`, w.Schema).Scan(&n))
		return n > 0
	}, 30*time.Second, 20*time.Millisecond)
	body := e.ok(loc)
	require.Contains(t, body, "<h1>Replay preview</h1>")
	require.Contains(t, body, `<p id="job-status" class="">running</p>`)
	require.Contains(t, body, `<meta http-equiv="refresh" content="1">`)
	require.Contains(t, body, `<progress id="job-progress"`)
	require.NotContains(t, body, `<table id="totals">`, "no result while it runs")
	require.Nil(t, confirmFields(body))

	// The same dry run joins the running job; another one, or a replay, waits.
	r = e.post("/dead-letters/preview", all)
	require.Equal(t, http.StatusSeeOther, r.status, r.body)
	require.Equal(t, loc, r.header.Get("Location"))
	withApplied := url.Values{"csrf": {csrf}, "consumer": {"loyalty"}, "scope": {"all"}, "include_applied": {"1"}}
	r = e.post("/dead-letters/preview", withApplied)
	require.Equal(t, http.StatusConflict, r.status)
	require.Contains(t, r.body, "running already")
	r = e.post("/dead-letters/replay", all)
	require.Equal(t, http.StatusConflict, r.status)
	require.Contains(t, r.body, "A dry run (preview of all matching) of loyalty is running already")

	closed := make(chan struct{})
	go func() {
		e.con.Close()
		close(closed)
	}()
	select {
	case <-closed:
	case <-time.After(30 * time.Second):
		t.Fatal("Close did not cancel the dry run")
	}
	body = e.ok(loc)
	require.Contains(t, body, `<p id="job-status" class="error">failed: interrupted by the console&#39;s shutdown`)
	require.NotContains(t, body, `http-equiv="refresh"`)
	require.Nil(t, confirmFields(body), "no confirmation for an interrupted dry run")
	require.NoError(t, tx.Rollback(ctx))
	require.Eventually(t, func() bool { return w.Depth(w.Poison) == 9 }, 10*time.Second, 20*time.Millisecond, "every letter back in the queue")
}
