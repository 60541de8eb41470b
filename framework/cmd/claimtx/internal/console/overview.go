package console

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"html/template"
	"io"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/claimtx/claimtx/brokers"
	"github.com/claimtx/claimtx/framework/cmd/claimtx/internal/opfmt"
	"github.com/claimtx/claimtx/framework/internal/replay"
	"github.com/claimtx/claimtx/internal/pg"
	"github.com/claimtx/claimtx/store"
)

// overviewRow is one consumer of the overview.
type overviewRow struct {
	Name              string
	Configured        bool
	Minute, Hour, Day int64 // applied in the last minute, hour and day
	Chart             template.HTML
	ActivityErr       string
	Newest            time.Time // the last claim, unless NewestNote says why not known
	NewestNote        string
	ClaimsErr         string
	// DeadLetters and Memos differ: a memo outlives its letter's replay
	// until cleared, and most letters have none.
	DeadLetters, DeadTitle string
	Memos, MemosTitle      string
	Duplicates             string
	DupTitle               string
	Horizon                badge
	Partitions             string
}

type badge struct {
	Color, Text, Title string
}

type overviewData struct {
	Table string
	// Oldest and Newest claim of the whole table: cleanup deletes by
	// processed_at whatever the consumer, so the oldest says if it keeps up.
	Oldest, Newest time.Time
	EndsErr        string
	Layout         string // "plain" or "partitioned by event day, N partitions"
	Rows           []overviewRow
	Truncated      bool // more consumers than maxConsumers
	ConsumersE     string
	Positions      []positionRow
	PositionsErr   string
	Parked         []parkedStatRow // consumers with parked order keys
	ParkedErr      string
}

// parkedStatRow is one consumer's parked order keys.
type parkedStatRow struct {
	Consumer       string
	Keys, Messages int64
	Oldest         string // age
}

func (c *Console) overview(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	d := overviewData{Table: c.cfg.Schema + "." + c.cfg.ClaimsTable}
	names, truncated, err := c.consumerNames(ctx)
	d.Truncated, d.ConsumersE = truncated, c.errText(err)
	rows := make([]overviewRow, len(names))
	for i, n := range names {
		rows[i] = overviewRow{Name: n, Configured: c.consumer(n) != nil}
	}

	var wg sync.WaitGroup
	wg.Go(func() {
		act, err := c.activity(ctx)
		var idle []string
		for i := range rows {
			if err != nil {
				rows[i].ActivityErr = c.errText(err)
				rows[i].ClaimsErr = rows[i].ActivityErr
				continue
			}
			a := act[rows[i].Name]
			if a == nil {
				a = &activity{}
				idle = append(idle, rows[i].Name)
			}
			rows[i].Minute, rows[i].Hour, rows[i].Newest = a.minute, a.hourly[23], a.newest
			for _, n := range a.hourly {
				rows[i].Day += n
			}
			rows[i].Chart = hourlyChart(a.hourly)
		}
		if len(idle) == 0 {
			return
		}
		last, tooOld, err := c.lastClaims(ctx, idle)
		for i := range rows {
			if !slices.Contains(idle, rows[i].Name) {
				continue
			}
			switch at, ok := last[rows[i].Name]; {
			case err != nil:
				rows[i].ClaimsErr = c.errText(err)
			case ok:
				rows[i].Newest = at
			case tooOld[rows[i].Name]:
				rows[i].NewestNote = "over 24 h ago"
			default:
				rows[i].NewestNote = "none"
			}
		}
	})
	wg.Go(func() {
		qctx, cancel := context.WithTimeout(ctx, c.cfg.QueryTimeout)
		defer cancel()
		stats, err := pg.ParkingOf(c.store).Stats(qctx)
		d.ParkedErr = c.errText(err)
		for _, s := range stats {
			d.Parked = append(d.Parked, parkedStatRow{Consumer: s.Consumer, Keys: s.Keys, Messages: s.Messages, Oldest: opfmt.Age(time.Since(s.Oldest))})
		}
	})
	wg.Go(func() {
		oldest, newest, err := c.tableEnds(ctx)
		d.Oldest, d.Newest, d.EndsErr = oldest, newest, c.errText(err)
	})
	wg.Go(func() {
		counts, exists, err := c.memoCounts(ctx)
		for i := range rows {
			switch {
			case err != nil:
				rows[i].Memos = c.errText(err)
			case !exists:
				rows[i].Memos, rows[i].MemosTitle = "—", "no poison memo table (schema before migration 4)"
			default:
				rows[i].Memos = strconv.FormatInt(counts[rows[i].Name], 10)
				rows[i].MemosTitle = "keys with a poison memo: their later copies go straight to the poison destination until claimtx unpoison clears it"
			}
		}
	})
	wg.Go(func() {
		positions, err := c.positions(ctx)
		d.Positions, d.PositionsErr = positions, c.errText(err)
	})
	var parts []store.Partition
	var partsErr error
	wg.Go(func() {
		pctx, cancel := context.WithTimeout(ctx, c.cfg.QueryTimeout)
		defer cancel()
		parts, partsErr = c.store.Partitions(pctx)
	})
	for i := range rows {
		wg.Go(func() { rows[i].Horizon = c.horizonBadge(ctx, rows[i].Name) })
		wg.Go(func() { rows[i].DeadLetters, rows[i].DeadTitle = c.deadLetterCount(ctx, rows[i].Name) })
		if u := c.cfg.Metrics[rows[i].Name]; u != "" {
			wg.Go(func() { rows[i].Duplicates, rows[i].DupTitle = c.duplicates(ctx, rows[i].Name, u) })
		} else {
			rows[i].Duplicates, rows[i].DupTitle = "—", "needs the consumer's metrics: start the console with --metrics "+rows[i].Name+"=http://HOST:PORT/metrics"
		}
	}
	wg.Wait()

	switch {
	case errors.Is(partsErr, store.ErrNotPartitioned):
		d.Layout = "plain"
	case partsErr != nil:
		d.Layout = "partitions: " + c.errText(partsErr)
	default:
		d.Layout = fmt.Sprintf("partitioned by event day, %d partitions", len(parts))
		for i := range rows {
			rows[i].Partitions = c.partitionState(parts, rows[i].Name, time.Now())
		}
	}
	d.Rows = rows
	c.render(w, r, http.StatusOK, "overview", page{Title: "Overview", Nav: "overview", Data: d})
}

// consumerNames is the configured consumers and those with claims,
// sorted; a loose index scan of the primary key finds the latter with one
// probe per consumer, however many claims each has.
func (c *Console) consumerNames(ctx context.Context) (names []string, truncated bool, err error) {
	q := c.names.Render(`WITH RECURSIVE cs AS (
  (SELECT consumer FROM {schema}.{claims} ORDER BY consumer LIMIT 1)
  UNION ALL
  SELECT (SELECT consumer FROM {schema}.{claims} WHERE consumer > cs.consumer ORDER BY consumer LIMIT 1)
  FROM cs WHERE cs.consumer IS NOT NULL
)
SELECT consumer FROM cs WHERE consumer IS NOT NULL LIMIT $1`)
	err = c.readOnly(ctx, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, q, maxConsumers+1)
		if err != nil {
			return err
		}
		names, err = pgx.CollectRows(rows, pgx.RowTo[string])
		return err
	})
	if len(names) > maxConsumers {
		names, truncated = names[:maxConsumers], true
	}
	for _, n := range c.configured() {
		if !slices.Contains(names, n) {
			names = append(names, n)
		}
	}
	slices.Sort(names)
	return names, truncated, err
}

type activity struct {
	minute int64
	hourly [24]int64 // [23] is the last hour
	newest time.Time
}

// activity counts the last 24 hours' claims per consumer and hour.
func (c *Console) activity(ctx context.Context) (map[string]*activity, error) {
	q := c.names.Render(`SELECT consumer,
       least(floor(extract(epoch FROM now() - processed_at) / 3600), 23)::int AS hours_ago,
       count(*),
       count(*) FILTER (WHERE processed_at > now() - interval '1 minute'),
       max(processed_at)
FROM {schema}.{claims}
WHERE processed_at > now() - interval '24 hours'
GROUP BY 1, 2`)
	out := map[string]*activity{}
	err := c.readOnly(ctx, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, q)
		if err != nil {
			return err
		}
		var name string
		var ago int
		var n, minute int64
		var newest time.Time
		_, err = pgx.ForEachRow(rows, []any{&name, &ago, &n, &minute, &newest}, func() error {
			a := out[name]
			if a == nil {
				a = &activity{}
				out[name] = a
			}
			if ago < 0 { // a clock running ahead of the database's
				ago = 0
			}
			a.hourly[23-ago] += n
			a.minute += minute
			if newest.After(a.newest) {
				a.newest = newest
			}
			return nil
		})
		return err
	})
	return out, err
}

// tableEnds: one probe at each end of the processed_at index.
func (c *Console) tableEnds(ctx context.Context) (oldest, newest time.Time, err error) {
	q := c.names.Render(`SELECT (SELECT min(processed_at) FROM {schema}.{claims}), (SELECT max(processed_at) FROM {schema}.{claims})`)
	err = c.readOnly(ctx, func(tx pgx.Tx) error {
		var o, n *time.Time
		if err := tx.QueryRow(ctx, q).Scan(&o, &n); err != nil {
			return err
		}
		if o != nil {
			oldest, newest = *o, *n
		}
		return nil
	})
	return oldest, newest, err
}

// idleSearch bounds lastClaims for all idle consumers together.
const idleSearch = time.Second

// lastClaims returns the last claim of each of names (consumers idle for
// 24 hours). Without an index on (consumer, processed_at), which would make
// every claim dearer, the processed_at index is walked back from its newest
// end; a consumer not reached within idleSearch is in tooOld, one without
// any claim in neither map.
func (c *Console) lastClaims(ctx context.Context, names []string) (last map[string]time.Time, tooOld map[string]bool, err error) {
	q := c.names.Render(`SELECT processed_at FROM {schema}.{claims} WHERE consumer = $1 ORDER BY processed_at DESC LIMIT 1`)
	last, tooOld = map[string]time.Time{}, map[string]bool{}
	deadline := time.Now().Add(min(idleSearch, c.cfg.QueryTimeout))
	for _, name := range names {
		left := time.Until(deadline)
		if left < time.Millisecond {
			tooOld[name] = true
			continue
		}
		err := c.readOnly(ctx, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, fmt.Sprintf("SET LOCAL statement_timeout = %d", left.Milliseconds())); err != nil {
				return err
			}
			var at time.Time
			switch err := tx.QueryRow(ctx, q, name).Scan(&at); {
			case errors.Is(err, pgx.ErrNoRows):
				return nil
			case err != nil:
				return err
			}
			last[name] = at
			return nil
		})
		switch {
		case errors.Is(err, errTimedOut):
			tooOld[name] = true
		case err != nil:
			return nil, nil, err
		}
	}
	return last, tooOld, nil
}

func (c *Console) memoCounts(ctx context.Context) (map[string]int64, bool, error) {
	out := map[string]int64{}
	exists := false
	err := c.readOnly(ctx, func(tx pgx.Tx) error {
		var err error
		if exists, err = pg.MemosOf(tx, c.names).Exists(ctx); err != nil || !exists {
			return err
		}
		rows, err := tx.Query(ctx, c.names.Render(`SELECT consumer, count(*) FROM {schema}.{memo} GROUP BY consumer`))
		if err != nil {
			return err
		}
		var name string
		var n int64
		_, err = pgx.ForEachRow(rows, []any{&name, &n}, func() error { out[name] = n; return nil })
		return err
	})
	return out, exists, err
}

// partitionState: day partitions ahead of today, and those past the
// consumer's retention not dropped yet.
func (c *Console) partitionState(parts []store.Partition, name string, now time.Time) string {
	today := now.UTC().Truncate(24 * time.Hour)
	var horizonDay time.Time // as DropExpiredPartitions decides
	if cs := c.consumer(name); cs != nil && cs.Retention > 0 {
		horizonDay = now.Add(-cs.Retention).UTC().Truncate(24 * time.Hour)
	}
	ahead, behind := 0, 0
	for _, p := range parts {
		if !p.From.IsZero() && p.From.After(today) {
			ahead++
		}
		if !p.To.IsZero() && !p.To.After(horizonDay) {
			behind++
		}
	}
	if horizonDay.IsZero() {
		return fmt.Sprintf("%d ahead; behind: needs the consumer's retention (--consumer-config)", ahead)
	}
	return fmt.Sprintf("%d ahead, %d behind", ahead, behind)
}

type horizonResult struct {
	at      time.Time
	horizon time.Duration
	known   bool
	err     string
}

// horizonTTL: Console.horizons keeps each consumer's replay horizon (a
// broker round trip) this long, as the overview may be reloaded often.
const horizonTTL = time.Minute

// horizonBadge is green when claims outlive every delivery, red when
// not, amber when retention or horizon is unknown.
func (c *Console) horizonBadge(ctx context.Context, name string) badge {
	cs := c.consumer(name)
	if cs == nil {
		return badge{Color: "amber", Text: "unknown", Title: "start the console with this consumer's --consumer-config to compare its retention with the broker's replay horizon"}
	}
	h := c.horizonOf(ctx, cs)
	ret := "none"
	if cs.Retention > 0 {
		ret = opfmt.FormatDuration(cs.Retention)
	}
	hz := "unknown"
	if h.known {
		hz = opfmt.FormatHorizon(h.horizon)
	}
	text := "retention " + ret + ", horizon " + hz
	switch {
	case h.err != "":
		return badge{Color: "amber", Text: text, Title: "the broker did not say: " + h.err}
	case !h.known:
		return badge{Color: "amber", Text: text, Title: "this broker cannot tell its replay horizon"}
	case cs.Retention <= 0:
		return badge{Color: "amber", Text: text, Title: "no retention configured: claims are kept until removed by hand, and no expiry guard runs"}
	case h.horizon > cs.Retention:
		return badge{Color: "red", Text: text, Title: "the broker can deliver a message older than the claims' retention: its claim may be gone (the expiry guard poisons it as expired); see docs/operations.md"}
	}
	return badge{Color: "green", Text: text, Title: "claims outlive every delivery the broker can still make"}
}

func (c *Console) horizonOf(ctx context.Context, cs *Consumer) horizonResult {
	if v, ok := c.horizons.Load(cs.Name); ok && time.Since(v.(horizonResult).at) < horizonTTL {
		return v.(horizonResult)
	}
	h := horizonResult{at: time.Now()}
	ctx, cancel := context.WithTimeout(ctx, c.cfg.QueryTimeout)
	defer cancel()
	sub, err := c.probe(cs.Broker)
	if err == nil {
		h.horizon, h.known, err = replay.Horizon(ctx, sub, cs.Topic, cs.PoisonTopic)
		_ = sub.Close()
	}
	if err != nil {
		h.err, h.known = c.errText(err), false
	}
	if ctx.Err() != nil && h.err == "" {
		h.err = "timed out"
	}
	c.horizons.Store(cs.Name, h)
	return h
}

// bounded is b with the dial timeouts cut to the query timeout: a broker
// that is down must not hold the page for the adapters' 30 s.
func (c *Console) bounded(b brokers.Config) brokers.Config {
	b.AMQP.DialTimeout, b.Kafka.DialTimeout, b.NATS.DialTimeout = c.cfg.QueryTimeout, c.cfg.QueryTimeout, c.cfg.QueryTimeout
	return b
}

// probe is a bounded subscriber of b's broker for questions: it never
// subscribes, so the group or durable it needs is never joined.
func (c *Console) probe(b brokers.Config) (message.Subscriber, error) {
	b = c.bounded(b)
	b.Kafka.ConsumerGroup = cmp.Or(b.Kafka.ConsumerGroup, "claimtx-console")
	b.NATS.Durable = cmp.Or(b.NATS.Durable, "claimtx-console")
	return brokers.NewSubscriber(b, nil)
}

// deadLetterCount is the letters in a consumer's poison destination as
// the dead-letters page counts them, with a title naming it.
func (c *Console) deadLetterCount(ctx context.Context, name string) (count, title string) {
	cs := c.consumer(name)
	if cs == nil {
		return "—", "start the console with this consumer's --consumer-config to count the letters in its poison destination"
	}
	ctx, cancel := context.WithTimeout(ctx, c.cfg.QueryTimeout)
	defer cancel()
	b := *cs
	b.Broker = c.bounded(cs.Broker)
	src, err := c.openDestination(ctx, &b, cs.Broker.Kind == brokers.KindKafka)
	if err != nil {
		return "unknown", err.Error()
	}
	defer func() { _ = src.Close() }()
	title = "messages in the poison queue " + cs.PoisonTopic
	switch cs.Broker.Kind {
	case brokers.KindKafka:
		title = "messages in the poison topic " + cs.PoisonTopic + " after the last replay's progress"
	case brokers.KindNATS:
		title = "messages in the poison subject " + cs.PoisonTopic
	}
	return strconv.FormatInt(src.Total(), 10), title + " (Dead letters lists them)"
}

const metricsTimeout = 2 * time.Second

// duplicates is the consumer's duplicate total (claimtx_messages_total),
// with applied and poisoned in the title.
func (c *Console) duplicates(ctx context.Context, name, u string) (string, string) {
	tot, err := scrapeOutcomes(ctx, u, name)
	if err != nil {
		return "unreachable", "metrics endpoint: " + c.errText(err)
	}
	f := func(o string) string { return strconv.FormatFloat(tot[o], 'f', -1, 64) }
	return f("duplicate"), "since the consumer started: applied " + f("applied") + ", duplicate " + f("duplicate") + ", poisoned " + f("poisoned") + " (claimtx_messages_total)"
}

// scrapeOutcomes sums claimtx_messages_total of consumer by outcome.
func scrapeOutcomes(ctx context.Context, u, consumer string) (map[string]float64, error) {
	ctx, cancel := context.WithTimeout(ctx, metricsTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "text/plain")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("status %s", resp.Status)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return nil, err
	}
	out := map[string]float64{}
	for _, m := range families["claimtx_messages_total"].GetMetric() {
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		if labels["consumer"] == consumer {
			out[labels["outcome"]] += m.GetCounter().GetValue() + m.GetUntyped().GetValue()
		}
	}
	return out, nil
}
