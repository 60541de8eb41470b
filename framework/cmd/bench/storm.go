package main

import (
	"context"
	"fmt"
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
	bare        result // per-message subscriber configuration, handler only acks
	claim       result // (c) over n already-claimed messages, cold
	claimWarm   result // (c) over n messages it applied just before
	bareWindow  result // the batch consumer's window configuration, handler only acks
	batch       result // (d) over n already-claimed messages, cold
	batchWarm   result // (d) over n messages it applied just before
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
	kafkaAddr, measure := sess.kafkaAddr, sess.measure
	var rows []stormRow
	for _, b := range o.brokers {
		for _, c := range o.concurrency {
			window := batchWindow
			if b == "amqp" {
				window = c * batchWindow // one consumer, as the batch consumer's
			}
			base := routerRun{broker: b, n: n, concurrency: c, amqpURL: o.amqpURL, kafkaAddr: kafkaAddr}
			runs := map[string][]result{}
			for rep := 0; rep < o.reps; rep++ {
				for _, m := range []struct {
					name string
					f    func(*env) (result, error)
				}{
					{"bare", func(e *env) (result, error) { r := base; r.bare = true; return runRouter(ctx, e, r) }},
					{"claim", func(e *env) (result, error) {
						r := base
						r.claim, r.preclaimed = true, true
						return runRouter(ctx, e, r)
					}},
					{"bare-window", func(e *env) (result, error) {
						r := base
						r.bare, r.window = true, window
						return runRouter(ctx, e, r)
					}},
					{"batch", func(e *env) (result, error) { r := base; r.workers, r.preclaimed = c, true; return runBatch(ctx, e, r) }},
					{"claim-warm", func(e *env) (result, error) {
						r := base
						r.claim, r.warm = true, true
						return runRouter(ctx, e, r)
					}},
					{"batch-warm", func(e *env) (result, error) { r := base; r.workers, r.warm = c, true; return runBatch(ctx, e, r) }},
				} {
					if !o.modes[m.name] {
						continue
					}
					res, err := measure(fmt.Sprintf("storm %s c=%d %s", b, c, m.name), c, m.f)
					if err != nil {
						return err
					}
					runs[m.name] = append(runs[m.name], res)
				}
			}
			rows = append(rows, stormRow{broker: b, concurrency: c, bare: median(runs["bare"]), claim: median(runs["claim"]),
				claimWarm: median(runs["claim-warm"]), bareWindow: median(runs["bare-window"]), batch: median(runs["batch"]),
				batchWarm: median(runs["batch-warm"])})
		}
	}
	fmt.Printf("Duplicate storm: %d already-applied messages per run, median of %d runs (`go run ./framework/cmd/bench -storm %d -reps %d -concurrency %s -brokers %s`, %s).\n\n",
		n, o.reps, n, o.reps, joinInts(o.concurrency), strings.Join(o.brokers, ","), time.Since(start).Round(time.Second))
	fmt.Print(renderStorm(rows))
	return nil
}

func renderStorm(rows []stormRow) string {
	var b strings.Builder
	fmt.Fprintf(&b, "| broker | conc | bare msg/s | claimtx cold msg/s | cold/bare | claimtx warm msg/s | warm/bare | bare (window) msg/s | batch cold msg/s | cold/bare | batch warm msg/s | warm/bare |\n")
	fmt.Fprintf(&b, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, r := range rows {
		fmt.Fprintf(&b, "| %s | %d | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", r.broker, r.concurrency,
			rateCell(r.bare), rateCell(r.claim), ratioCell(r.claim, r.bare), rateCell(r.claimWarm), ratioCell(r.claimWarm, r.bare),
			rateCell(r.bareWindow), rateCell(r.batch), ratioCell(r.batch, r.bareWindow), rateCell(r.batchWarm), ratioCell(r.batchWarm, r.bareWindow))
	}
	return b.String()
}

// rateCell and ratioCell render a storm cell, "-" for a mode -modes left out.
func rateCell(r result) string {
	if r.n == 0 {
		return "-"
	}
	return fmt.Sprintf("%.0f", r.rate())
}

func ratioCell(r, base result) string {
	if r.n == 0 || base.n == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f", r.rate()/base.rate())
}
