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
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/brokers"
	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/framework/cmd/claimtx/internal/console"
	"github.com/claimtx/claimtx/framework/cmd/claimtx/internal/dlq"
	"github.com/claimtx/claimtx/framework/cmd/claimtx/internal/dlq/dlqtest"
)

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
		if w.Kind == brokers.KindAMQP {
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
