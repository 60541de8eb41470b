//go:build bench

package bench

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// A duplicate storm: a Kafka group reset to an old offset, a week of dead
// letters replayed, a producer re-sending. Nearly every message is then a
// duplicate whose claim exists, and what matters is how close claimtx gets
// to the broker's bare consume+ack rate for the same subscriber
// configuration (no database at all).
//
// Each claimtx mode runs the storm twice: cold, a fresh process after a
// group reset, whose committed-key cache starts empty, so every duplicate
// costs a round trip (the claims were written before the consumer
// started); and warm, the same consumer process having applied the
// messages just before (a producer's re-send, a redelivery after a
// rebalance), so its cache answers.

type stormRow struct {
	broker      string
	concurrency int
	// runs holds every run of each mode (stormModes), in rep order:
	// bare (per-message subscriber configuration, handler only acks),
	// claim (cold), claim-warm, bare-window (the batch consumer's window
	// configuration, handler only acks), batch (cold), batch-warm.
	runs map[string][]result
}

// rate is the median rate of mode, "-" when it was left out.
func (r stormRow) rate(mode string) string {
	m := median(r.runs[mode])
	if m.n == 0 {
		return "-"
	}
	return fmt.Sprintf("%.0f", m.rate())
}

// ratio is the median over reps of mode's rate over base's in the same
// rep: the modes of a rep run back to back, so each pair meets the same
// state of the machine and broker (RabbitMQ's consumers here switch
// between two speeds from one run to the next, which a ratio of the two
// medians would mix).
func (r stormRow) ratio(mode, base string) string {
	a, b := r.runs[mode], r.runs[base]
	n := min(len(a), len(b))
	if n == 0 {
		return "-"
	}
	ratios := make([]float64, n)
	for i := range ratios {
		ratios[i] = a[i].rate() / b[i].rate()
	}
	sort.Float64s(ratios)
	return fmt.Sprintf("%.2f", ratios[(n-1)/2])
}

// stormModes are the -modes of -storm, in the order one row's runs
// interleave.
var stormModes = []string{"bare", "claim", "bare-window", "batch", "claim-warm", "batch-warm"}

// preclaim writes the claims of orders 0..n-1 as the bench consumer's key
// spec derives them, as if they had been applied before, one transaction
// each, in order (an hour ago, 10 µs apart): each claim has its own
// processed_at, as a per-message consumer leaves them. Then it vacuums
// and analyzes the table, as autovacuum would have in the hour since:
// the first reader of a million fresh rows would otherwise also pay for
// setting their hint bits, and the planner would see an empty table.
func preclaim(ctx context.Context, e *env, n int) error {
	table := pgx.Identifier{e.schema, "processed_messages"}.Sanitize()
	_, err := e.pool.Exec(ctx, `INSERT INTO `+table+`
		(consumer, message_key, processed_at)
		SELECT 'bench', 'order-completed:' || g, now() - interval '1 hour' + g * interval '10 microseconds'
		FROM generate_series(0, $1 - 1) g`, n)
	if err == nil {
		_, err = e.pool.Exec(ctx, "VACUUM (ANALYZE) "+table)
	}
	if err != nil {
		return fmt.Errorf("preclaim: %w", err)
	}
	return nil
}

func stormRun(ctx context.Context, o options, n int) error {
	start := time.Now()
	sess, err := openSession(ctx, o)
	if err != nil {
		return err
	}
	defer sess.close()
	var rows []stormRow
	for _, b := range o.brokers {
		for _, c := range o.concurrency {
			window := batchWindow
			if b == "amqp" {
				window = c * batchWindow // one consumer, as the batch consumer's
			}
			base := routerRun{broker: b, n: n, concurrency: c, amqpURL: o.amqpURL, kafkaAddr: sess.kafkaAddr}
			modes := []mode{
				{"bare", func(e *env) (result, error) { r := base; r.bare = true; return runRouter(ctx, e, r) }},
				{"claim", func(e *env) (result, error) {
					r := base
					r.claim, r.preclaimed = true, true
					return runRouter(ctx, e, r)
				}},
				{"bare-window", func(e *env) (result, error) { r := base; r.bare, r.window = true, window; return runRouter(ctx, e, r) }},
				{"batch", func(e *env) (result, error) { r := base; r.workers, r.preclaimed = c, true; return runBatch(ctx, e, r) }},
				{"claim-warm", func(e *env) (result, error) { r := base; r.claim, r.warm = true, true; return runRouter(ctx, e, r) }},
				{"batch-warm", func(e *env) (result, error) { r := base; r.workers, r.warm = c, true; return runBatch(ctx, e, r) }},
			}
			runs := map[string][]result{}
			for rep := 0; rep < o.reps; rep++ {
				if err := sess.round(fmt.Sprintf("storm %s c=%d", b, c), c, modes, runs); err != nil {
					return err
				}
			}
			rows = append(rows, stormRow{broker: b, concurrency: c, runs: runs})
		}
	}
	fmt.Printf("Duplicate storm: %d already-applied messages per run, median of %d runs, each ratio the median of the runs' ratios to the baseline run of the same round (`%s`, %s).\n\n",
		n, o.reps, command(fmt.Sprintf("-storm %d -reps %d -concurrency %s -brokers %s", n, o.reps, joinInts(o.concurrency), strings.Join(o.brokers, ","))), time.Since(start).Round(time.Second))
	fmt.Print(renderStorm(rows))
	return nil
}

func renderStorm(rows []stormRow) string {
	var b strings.Builder
	tableHead(&b, "broker", "conc", "bare msg/s", "claimtx cold msg/s", "cold/bare", "claimtx warm msg/s", "warm/bare", "bare (window) msg/s", "batch cold msg/s", "cold/bare", "batch warm msg/s", "warm/bare")
	for _, r := range rows {
		fmt.Fprintf(&b, "| %s | %d | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", r.broker, r.concurrency,
			r.rate("bare"), r.rate("claim"), r.ratio("claim", "bare"), r.rate("claim-warm"), r.ratio("claim-warm", "bare"),
			r.rate("bare-window"), r.rate("batch"), r.ratio("batch", "bare-window"), r.rate("batch-warm"), r.ratio("batch-warm", "bare-window"))
	}
	return b.String()
}
