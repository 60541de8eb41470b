package console_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/brokers"
	"github.com/claimtx/claimtx/framework/cmd/claimtx/internal/console"
	"github.com/claimtx/claimtx/framework/cmd/claimtx/internal/dlq/dlqtest"
	"github.com/claimtx/claimtx/store"
)

// row returns the overview's <tr> of consumer.
func row(t *testing.T, body, consumer string) string {
	t.Helper()
	start := strings.Index(body, `<tr data-consumer="`+consumer+`">`)
	require.GreaterOrEqual(t, start, 0, "no row for %s in\n%s", consumer, body)
	end := strings.Index(body[start:], "</tr>")
	return body[start : start+end]
}

func cells(tr string) []string {
	var out []string
	for _, m := range regexp.MustCompile(`(?s)<td[^>]*>(.*?)</td>`).FindAllStringSubmatch(tr, -1) {
		out = append(out, strings.TrimSpace(m[1]))
	}
	return out
}

// The overview lists the consumers of the claim table and the configured
// ones, with their activity from one query, a chart, the memo count, the
// metrics' duplicates, the ends of their claims and the horizon badge.
func TestOverview(t *testing.T) {
	t.Parallel()
	metrics := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = fmt.Fprint(w, `# HELP claimtx_messages_total x
# TYPE claimtx_messages_total counter
claimtx_messages_total{consumer="loyalty",handler="h1",outcome="applied"} 40
claimtx_messages_total{consumer="loyalty",handler="h2",outcome="applied"} 2
claimtx_messages_total{consumer="loyalty",handler="h1",outcome="duplicate"} 7
claimtx_messages_total{consumer="loyalty",handler="h1",outcome="poisoned"} 3
claimtx_messages_total{consumer="other",handler="h1",outcome="duplicate"} 1000
`)
	}))
	t.Cleanup(metrics.Close)
	ttl := func(ms int) brokers.Config {
		var b brokers.Config
		b.AMQP.QueueArguments = map[string]any{"x-message-ttl": ms}
		return b
	}
	e := newEnv(t, func(c *console.Config) {
		c.Consumers = []console.Consumer{
			{Name: "loyalty", Topic: "orders", Retention: 30 * 24 * time.Hour, Broker: ttl(24 * 3600 * 1000)},
			{Name: "billing", Topic: "invoices", Retention: 12 * time.Hour, Broker: ttl(24 * 3600 * 1000)},
			{Name: "idle", Topic: "nothing"},
		}
		c.Metrics = map[string]string{"loyalty": metrics.URL, "billing": "http://127.0.0.1:1/metrics"}
	})
	claims := pgx.Identifier{e.schema, "processed_messages"}.Sanitize()
	// loyalty: 3 in the last minute, 2 more in the last hour, 4 three
	// hours ago, 5 two days ago (outside the day).
	e.exec(`INSERT INTO ` + claims + ` (consumer, message_key, processed_at) SELECT 'loyalty', 'k' || g,
  now() - CASE WHEN g <= 3 THEN interval '10 seconds' WHEN g <= 5 THEN interval '20 minutes'
               WHEN g <= 9 THEN interval '3 hours 10 minutes' ELSE interval '2 days' END - g * interval '1 millisecond'
FROM generate_series(1, 14) g`)
	e.exec(`INSERT INTO ` + claims + ` (consumer, message_key, processed_at) VALUES ('billing', 'b1', now() - interval '5 hours'), ('archived', 'a1', now() - interval '72 hours'), ('<script>alert(1)</script>', 'x', now())`)
	e.exec(`INSERT INTO ` + pgx.Identifier{e.schema, "processed_messages_poison_memo"}.Sanitize() + ` (consumer, message_key, reason) VALUES ('loyalty', 'p1', 'bad'), ('loyalty', 'p2', 'bad')`)

	body := e.ok("/")
	require.Contains(t, body, "<h1>Overview</h1>")
	require.Contains(t, body, `<table id="consumers">`)
	require.NotContains(t, body, "<script>alert(1)</script>")
	require.Contains(t, body, "&lt;script&gt;alert(1)&lt;/script&gt;")

	lo := row(t, body, "loyalty")
	c := cells(lo)
	require.Equal(t, []string{"3", "5", "9"}, c[1:4], "minute, hour, day")
	require.Contains(t, c[4], "<svg")
	require.Contains(t, c[4], "last hour: 5 applied")
	require.Contains(t, c[4], "3–4 h ago: 4 applied")
	require.Equal(t, "2", c[6], "poison memos")
	require.Equal(t, "7", c[7], "duplicates from the metrics")
	require.Contains(t, lo, "applied 42, duplicate 7, poisoned 3")
	require.Regexp(t, `^\d{4}-\d\d-\d\d \d\d:\d\d:\d\dZ$`, c[8], "last claim")
	require.Greater(t, c[8], time.Now().UTC().Add(-time.Minute).Format("2006-01-02 15:04:05Z"), "the last claim is the one 10 s ago")
	// The table's ends: the oldest is loyalty's of two days ago.
	ends := regexp.MustCompile(`Claims in the table from <span class="ts">([^<]+)</span>.*to <span class="ts">([^<]+)</span>`).FindStringSubmatch(body)
	require.NotNil(t, ends, "the table's oldest and newest claim")
	require.Less(t, ends[1], time.Now().UTC().Add(-47*time.Hour).Format("2006-01-02 15:04:05Z"))
	require.Less(t, ends[1], ends[2])
	// A consumer without a claim in 24 hours: its last claim is searched
	// for (a small table: found).
	require.Equal(t, time.Now().UTC().Add(-72*time.Hour).Format("2006-01-02"), cells(row(t, body, "archived"))[8][:10])
	require.Contains(t, lo, `badge green`)
	require.Contains(t, lo, "retention 30d, horizon 1d")

	bi := cells(row(t, body, "billing"))
	require.Equal(t, []string{"0", "0", "1"}, bi[1:4])
	require.Equal(t, "unreachable", bi[7])
	require.Contains(t, row(t, body, "billing"), "badge red")
	require.Contains(t, row(t, body, "billing"), "retention 12h, horizon 1d")

	idle := row(t, body, "idle")
	require.Contains(t, idle, "badge amber", "no retention configured")
	require.Contains(t, idle, "—")
	require.Contains(t, cells(idle)[7], "—")
	require.Equal(t, "none", cells(idle)[8], "a configured consumer without claims")
	require.Contains(t, idle, "--metrics idle=")

	// Not configured: no dead letters link, horizon unknown.
	xss := row(t, body, "&lt;script&gt;alert(1)&lt;/script&gt;")
	require.NotContains(t, xss, "DLQ")
	require.Contains(t, xss, "badge amber")
	require.Equal(t, "—", cells(xss)[5], "no poison destination to count")
}

// The overview shows the letters in a consumer's poison destination and
// its poison memos as two figures: 10 letters sit in the destination, and
// only the 2 keys a memo blocks are memos (a "Poisoned 0" beside 10
// letters once counted the memos alone).
func TestOverviewDeadLetters(t *testing.T) {
	dlqtest.EachBroker(t, 1, func(t *testing.T, w *dlqtest.World) {
		w.Publish(w.Poison, w.Poisoned("loyalty", dlqKeySpec, errors.New("cannot decode"), dlqtest.Orders(1, 10)...)...)
		e := dlqEnv(t, w, nil)
		e.exec(`INSERT INTO ` + pgx.Identifier{e.schema, "processed_messages_poison_memo"}.Sanitize() + ` (consumer, message_key, reason) VALUES ('loyalty', 'order:1', 'bad'), ('loyalty', 'order:2', 'bad')`)
		body := e.ok("/")
		require.Contains(t, body, `<th class="num">Dead letters</th><th class="num">Poison memos</th>`)
		lo := row(t, body, "loyalty")
		c := cells(lo)
		require.Equal(t, []string{"10", "2"}, c[5:7], "dead letters, poison memos")
		require.Contains(t, lo, "messages in the poison "+map[string]string{brokers.KindAMQP: "queue ", brokers.KindKafka: "topic ", brokers.KindNATS: "subject "}[w.Kind]+w.Poison)
		require.Contains(t, lo, "keys with a poison memo")
	})
}

// A slow claim table makes cells say so; the page still renders.
func TestOverviewTimeout(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *console.Config) {
		c.QueryTimeout = 200 * time.Millisecond
		c.Consumers = []console.Consumer{{Name: "loyalty", Topic: "orders"}}
	})
	ctx := context.Background()
	tx, err := e.pool.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(ctx) })
	_, err = tx.Exec(ctx, "LOCK TABLE "+pgx.Identifier{e.schema, "processed_messages"}.Sanitize()+" IN ACCESS EXCLUSIVE MODE")
	require.NoError(t, err)
	body := e.ok("/")
	require.Contains(t, body, "slow: timed out")
	require.Contains(t, row(t, body, "loyalty"), "slow: timed out")
}

// A partitioned claim table shows the partitions ahead of today and those
// past the retention not dropped yet.
func TestOverviewPartitions(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *console.Config) {
		c.Consumers = []console.Consumer{{Name: "loyalty", Topic: "orders", Retention: 10 * 24 * time.Hour}}
	})
	st, err := store.New(e.pool, store.Config{Schema: e.schema})
	require.NoError(t, err)
	_, err = st.EnablePartitioning(context.Background(), store.RetentionConfig{Retention: 10 * 24 * time.Hour, Ahead: 3})
	require.NoError(t, err)
	// Two expired days nobody dropped.
	for _, ago := range []int{20, 21} {
		day := time.Now().UTC().AddDate(0, 0, -ago).Truncate(24 * time.Hour)
		e.exec(fmt.Sprintf(`CREATE TABLE %s PARTITION OF %s FOR VALUES FROM ('%s') TO ('%s')`,
			pgx.Identifier{e.schema, "processed_messages_old" + fmt.Sprint(ago)}.Sanitize(), pgx.Identifier{e.schema, "processed_messages"}.Sanitize(),
			day.Format(time.DateOnly), day.AddDate(0, 0, 1).Format(time.DateOnly)))
	}
	body := e.ok("/")
	require.Contains(t, body, "partitioned by event day")
	require.Contains(t, row(t, body, "loyalty"), "3 ahead, 2 behind")
}
