//go:build benchconsole

// Page times of the console at scale (`make bench-console`):
//
//	BENCH_CLAIMS=10000000 BENCH_LETTERS=100000 go test -tags benchconsole -run '^TestPageTimes$' -count=1 -timeout 60m -v ./framework/cmd/claimtx/internal/console/
//
// It writes BENCH_CLAIMS claims spread over the last 30 days (nine in ten
// for the consumer whose dead letters are browsed, the rest for a second
// one), 10,000 poison memos, and BENCH_LETTERS dead letters into a RabbitMQ
// poison queue and a Kafka poison topic (copies made by the real Poison
// middleware, every other one of an order that is already applied), then
// serves the console in-process and requests each page REPS times (default
// 5), printing the median and range of each in a Markdown table.
package console_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/framework/cmd/claimtx/internal/console"
	"github.com/claimtx/claimtx/framework/cmd/claimtx/internal/dlq/dlqtest"
)

const benchKeySpec = "template:order:{payload.order_id}"

func envInt(t *testing.T, name string, def int) int {
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	v, err := strconv.Atoi(s)
	require.NoError(t, err, name)
	return v
}

func TestPageTimes(t *testing.T) {
	claims := envInt(t, "BENCH_CLAIMS", 10_000_000)
	letters := envInt(t, "BENCH_LETTERS", 100_000)
	reps := envInt(t, "REPS", 5)
	ctx := context.Background()

	worlds := map[string]*dlqtest.World{}
	for _, kind := range dlqtest.Brokers {
		worlds[kind] = dlqtest.New(t, kind, 3)
	}
	// One claim table (the console reads one): the RabbitMQ world's.
	w := worlds["amqp"]
	consumerOf := func(kind string) string { return "loyalty-" + kind }

	start := time.Now()
	const chunk = 1_000_000
	for lo := 1; lo <= claims; lo += chunk {
		hi := min(lo+chunk-1, claims)
		// Each chunk is its own transaction, as claims are; processed_at
		// rises with g over the last 30 days, as claims arrive.
		_, err := w.Pool.Exec(ctx, fmt.Sprintf(`INSERT INTO %q.processed_messages (consumer, message_key, processed_at)
SELECT CASE WHEN g %% 10 = 0 THEN 'shipping' ELSE 'loyalty-amqp' END, 'order:' || (g + 10000000),
       now() - interval '30 days' * (1 - g::float8 / $1)
FROM generate_series($2::bigint, $3::bigint) g`, w.Schema), claims, lo, hi)
		require.NoError(t, err)
	}
	_, err := w.Pool.Exec(ctx, fmt.Sprintf(`INSERT INTO %q.processed_messages_poison_memo (consumer, message_key, reason)
SELECT 'loyalty-amqp', 'order:bad-' || g, 'seeded memo ' || g FROM generate_series(1, 10000) g`, w.Schema))
	require.NoError(t, err)
	_, err = w.Pool.Exec(ctx, fmt.Sprintf(`VACUUM (ANALYZE) %q.processed_messages`, w.Schema))
	require.NoError(t, err)
	t.Logf("%d claims and 10000 memos written in %s", claims, time.Since(start).Round(time.Second))

	var cons []console.Consumer
	for _, kind := range dlqtest.Brokers {
		kw := worlds[kind]
		start := time.Now()
		orders := make([]*message.Message, letters)
		for i := range orders {
			orders[i] = dlqtest.Order(i + 1)
		}
		// Every other letter is already applied: classification then finds
		// both classes.
		_, err := w.Pool.Exec(ctx, fmt.Sprintf(`INSERT INTO %q.processed_messages (consumer, message_key)
SELECT $1, 'order:' || g FROM generate_series(1, $2::int) g WHERE g %% 2 = 0 ON CONFLICT DO NOTHING`, w.Schema), consumerOf(kind), letters)
		require.NoError(t, err)
		for lo := 0; lo < letters; lo += 10_000 {
			batch := orders[lo:min(lo+10_000, letters)]
			kw.Publish(kw.Poison, kw.Poisoned(consumerOf(kind), benchKeySpec, framework.Permanent(errors.New("bad deploy")), batch...)...)
		}
		t.Logf("%s: %d dead letters written in %s", kind, letters, time.Since(start).Round(time.Millisecond))
		cons = append(cons, console.Consumer{Name: consumerOf(kind), Topic: kw.Topic, PoisonTopic: kw.Poison, Key: benchKeySpec, Broker: kw.Broker})
	}

	c, err := console.New(console.Config{Pool: w.Pool, Schema: w.Schema, Consumers: cons})
	require.NoError(t, err)
	srv := httptest.NewServer(c)
	t.Cleanup(func() { srv.Close(); c.Close() })

	type row struct {
		page, what string
		times      []time.Duration
	}
	var rows []row
	timeItN := func(n int, page, what string, do func() (int, string)) string {
		var times []time.Duration
		var body string
		for range n {
			start := time.Now()
			code, b := do()
			times = append(times, time.Since(start))
			require.Equal(t, http.StatusOK, code, "%s: %s", page, b)
			body = b
		}
		slices.Sort(times)
		rows = append(rows, row{page, what, times})
		return body
	}
	timeIt := func(page, what string, do func() (int, string)) string { return timeItN(reps, page, what, do) }
	get := func(path string) func() (int, string) {
		return func() (int, string) {
			resp, err := http.Get(srv.URL + path)
			require.NoError(t, err)
			defer resp.Body.Close()
			b, err := io.ReadAll(resp.Body)
			require.NoError(t, err)
			return resp.StatusCode, string(b)
		}
	}
	noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	post := func(path string, form url.Values) func() (int, string) {
		return func() (int, string) {
			resp, err := http.PostForm(srv.URL+path, form)
			require.NoError(t, err)
			defer resp.Body.Close()
			b, err := io.ReadAll(resp.Body)
			require.NoError(t, err)
			return resp.StatusCode, string(b)
		}
	}

	timeIt("/", "overview: 3 consumers, "+strconv.Itoa(claims)+" claims over 30 days", get("/"))
	timeIt("/lookup", "look up a key that has a claim", get("/lookup?consumer=loyalty-amqp&key=order:"+strconv.Itoa(10_000_000+claims/2)))
	timeIt("/lookup", "look up a key that has none", get("/lookup?consumer=loyalty-amqp&key=order:nope"))
	csrf := regexp.MustCompile(`name="csrf" value="([^"]+)"`)
	idRe := regexp.MustCompile(`name="id" value="([^"]+)"`)
	for _, kind := range dlqtest.Brokers {
		name := consumerOf(kind)
		page1 := timeIt("/dead-letters", kind+": page 1 of "+strconv.Itoa(letters), get("/dead-letters?consumer="+name))
		timeIt("/dead-letters", kind+": page 10", get("/dead-letters?consumer="+name+"&page=10"))
		timeIt("/dead-letters", kind+": a reason no letter has (scan cap)", get("/dead-letters?consumer="+name+"&reason=nothing-like-this"))
		m := csrf.FindStringSubmatch(page1)
		require.NotNil(t, m, "csrf field on the dead-letters page")
		form := url.Values{"csrf": {m[1]}, "consumer": {name}}
		for _, id := range idRe.FindAllStringSubmatch(page1, -1) {
			form.Add("id", id[1])
		}
		require.Len(t, form["id"], 50)
		timeIt("/dead-letters/preview", kind+": dry run of the 50 letters of page 1", post("/dead-letters/preview", form))
		// A dry run of every letter reads the whole destination, in a job:
		// the POST only starts it; time it, and the job until it is done.
		all := url.Values{"csrf": {m[1]}, "consumer": {name}, "scope": {"all"}}
		start := time.Now()
		resp, err := noRedirect.PostForm(srv.URL+"/dead-letters/preview", all)
		require.NoError(t, err)
		_ = resp.Body.Close()
		posted := time.Since(start)
		require.Equal(t, http.StatusSeeOther, resp.StatusCode)
		loc := resp.Header.Get("Location")
		rows = append(rows, row{"/dead-letters/preview", kind + ": start the dry run of all " + strconv.Itoa(letters) + " letters (303 to its job; once)", []time.Duration{posted}})
		var polls []time.Duration
		var body string
		for {
			// The poll interval is the resolution of the job's time.
			pollStart := time.Now()
			code, b := get(loc)()
			polls = append(polls, time.Since(pollStart))
			require.Equal(t, http.StatusOK, code, b)
			require.NotContains(t, b, `<p id="job-status" class="error">`, "the dry run failed")
			if strings.Contains(b, `<p id="job-status" class="">done</p>`) {
				body = b
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		done := time.Since(start)
		require.Contains(t, body, `id="would-replay">`+strconv.Itoa(letters/2)+`<`, "every other letter would apply")
		rows = append(rows, row{"/jobs/ID", kind + ": the dry run of all " + strconv.Itoa(letters) + " letters, from the POST until its page reads done (once)", []time.Duration{done}})
		slices.Sort(polls)
		rows = append(rows, row{"/jobs/ID", kind + ": the dry-run job's page, each poll while it runs and the last (" + strconv.Itoa(len(polls)) + " polls)", polls})
	}

	var b strings.Builder
	fmt.Fprintf(&b, "\nConsole page times, %d claims, %d dead letters per broker, %d requests each (`make bench-console`):\n\n", claims, letters, reps)
	fmt.Fprintf(&b, "| page | request | median | range |\n|---|---|---:|---|\n")
	ms := func(d time.Duration) string {
		return strconv.FormatFloat(float64(d.Microseconds())/1000, 'f', 1, 64) + " ms"
	}
	for _, r := range rows {
		fmt.Fprintf(&b, "| `%s` | %s | %s | %s–%s |\n", r.page, r.what, ms(r.times[len(r.times)/2]), ms(r.times[0]), ms(r.times[len(r.times)-1]))
	}
	fmt.Print(b.String())
}
