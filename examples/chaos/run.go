package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/claimtx/claimtx/examples/internal/orderfeed"
)

// brokerOps is what the runner needs of a broker besides the consumers.
type brokerOps interface {
	name() string
	prepare(ctx context.Context) error
	// publish sends ds and returns how many deliveries went out, retried
	// ones included.
	publish(ctx context.Context, ds []delivery) (int, error)
	drained(ctx context.Context) (bool, error)
	remaining(ctx context.Context) (int, error)
	poisonedCount(ctx context.Context) (int, error)
	poisonedIDs(ctx context.Context) ([]string, error)
	disrupt(ctx context.Context) (string, error)
	close()
}

// report is the outcome of one broker's chaos run.
type report struct {
	broker                string
	orders, bad           int
	published             int // deliveries sent, producer retries included
	planned               int
	redelivered, copies   int
	freshIDs, twins       int
	applied, ledgerRows   int
	lost, doubled, stuck  int
	poisoned, misPoisoned int
	expectedPts, gotPts   int64
	kills, unexpected     int
	consumerStarts        int
	pgRestarts            int
	brokerDisruptions     int
	minKills              int
	wantPGRestart         bool
	elapsed, drain        time.Duration
	err                   error
}

func (r report) ok() bool {
	return r.err == nil && r.applied == r.orders && r.ledgerRows == r.orders && r.lost == 0 &&
		r.doubled == 0 && r.stuck == 0 && r.expectedPts == r.gotPts && r.poisoned >= r.bad &&
		r.misPoisoned == 0 && r.kills >= r.minKills && r.brokerDisruptions == 1 &&
		(!r.wantPGRestart || r.pgRestarts == 1)
}

// summary is the one line printed per broker.
func (r report) summary() string {
	res := "OK"
	if !r.ok() {
		res = "FAIL"
		if r.err != nil {
			res += " (" + r.err.Error() + ")"
		}
	}
	return fmt.Sprintf("chaos %-5s %s: orders=%d deliveries=%d (redelivered=%d extra_copies=%d fresh_ids=%d twins=%d bad=%d) "+
		"applied=%d ledger_rows=%d lost=%d doubled=%d stuck=%d poisoned=%d wrongly_poisoned=%d points=%d/%d "+
		"sigkills=%d consumer_exits_restarted=%d pg_restarts=%d broker_disruptions=%d elapsed=%s drain=%s",
		r.broker, res, r.orders, r.published, r.redelivered, r.copies, r.freshIDs, r.twins, r.bad,
		r.applied, r.ledgerRows, r.lost, r.doubled, r.stuck, r.poisoned, r.misPoisoned, r.gotPts, r.expectedPts,
		r.kills, r.unexpected, r.pgRestarts, r.brokerDisruptions,
		r.elapsed.Round(100*time.Millisecond), r.drain.Round(100*time.Millisecond))
}

// runBroker runs the whole scenario against one broker.
func runBroker(ctx context.Context, o options, kind string) (rep report) {
	start := time.Now()
	rep = report{broker: kind, orders: o.orders, bad: o.bad, minKills: o.minKills, wantPGRestart: o.pgRestart != ""}
	defer func() { rep.elapsed = time.Since(start) }()
	if err := runScenario(ctx, o, kind, &rep); err != nil {
		rep.err = err
	}
	return rep
}

func runScenario(ctx context.Context, o options, kind string, rep *report) error {
	id := orderfeed.RunID()
	schema := fmt.Sprintf("chaos_%s_%s", kind, id)
	topic := fmt.Sprintf("chaos-orders-%s-%s", kind, id)
	group := "loyalty-chaos-" + id
	rng := rand.New(rand.NewPCG(o.seed, uint64(len(kind)))) //nolint:gosec // reproducible chaos, not secrets
	o.logf("== %s: topic %s, schema %s, logs %s", kind, topic, schema, o.logDir)
	start := time.Now()
	elapsed := func() string { return time.Since(start).Round(100 * time.Millisecond).String() }

	pool, err := pgxpool.New(ctx, o.databaseURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize()); err != nil {
		return err
	}
	if !o.keep {
		defer func() {
			// The schema goes even if Postgres is still coming back from
			// its restart.
			dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
			defer cancel()
			_ = waitPostgres(dctx, pool)
			if _, err := pool.Exec(dctx, "DROP SCHEMA "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
				o.logf("   drop schema %s: %v", schema, err)
			}
		}()
	}
	dbURL, err := orderfeed.WithSearchPath(o.databaseURL, schema)
	if err != nil {
		return err
	}

	var ops brokerOps
	var sup *supervisor // set below; the AMQP disruption asks it for the consumers' pids
	kafkaAddr := ""
	switch kind {
	case "amqp":
		ops = &amqpOps{url: o.amqpURL, topic: topic, keep: o.keep, closeOwn: o.amqpDisrupt == "own",
			pids: func() []int { return sup.pids() }}
	case "kafka":
		if kafkaAddr, err = freeAddr(); err != nil {
			return err
		}
		dataDir, err := os.MkdirTemp("", "chaos-devkafka-")
		if err != nil {
			return err
		}
		defer func() { _ = os.RemoveAll(dataDir) }()
		ops = &kafkaOps{topic: topic, group: group, broker: &devKafka{
			bin: o.devkafka, addr: kafkaAddr, dataDir: dataDir,
			logPath: filepath.Join(o.logDir, fmt.Sprintf("kafka-%s-devkafka.log", id)),
		}}
	default:
		return fmt.Errorf("unknown broker %q", kind)
	}
	defer ops.close()
	if err := ops.prepare(ctx); err != nil {
		return err
	}

	env := append(os.Environ(),
		"BROKER="+kind, "DATABASE_URL="+dbURL, "CLAIMTX_SCHEMA="+schema, "TOPIC="+topic,
		"AMQP_URL="+o.amqpURL, "KAFKA_BROKERS="+kafkaAddr, "KAFKA_CONSUMER_GROUP="+group,
		// Short sessions: a SIGKILLed member's partitions move on within
		// seconds (and the dev broker evicts members killed mid-join).
		"KAFKA_SESSION_TIMEOUT=3s", "KAFKA_REBALANCE_TIMEOUT=3s",
		"CONCURRENCY=4", "METRICS_ADDR=127.0.0.1:0")
	sup = newSupervisor(o.loyalty, env, o.logDir, fmt.Sprintf("%s-%s", kind, id), o.consumers, o.logf)
	defer sup.stop(20 * time.Second)
	if err := sup.startAll(); err != nil {
		return err
	}

	pl := makePlan(o.orders, o.bad, rng)
	rep.planned, rep.redelivered, rep.copies, rep.freshIDs, rep.twins = len(pl.deliveries), pl.redelivered, pl.extraCopies, pl.freshIDs, pl.twins
	rep.expectedPts = pl.expectedPoints
	o.logf("   plan: %d deliveries: %d orders, %d redelivered with %d extra copies (%d with fresh broker ids, %d twins), %d bad",
		len(pl.deliveries), pl.orders, pl.redelivered, pl.extraCopies, pl.freshIDs, pl.twins, pl.bad)

	runCtx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()

	// Publish in chunks spread over the chaos phase, so kills, the
	// Postgres restart and the broker disruption all hit a busy system.
	var pubWG sync.WaitGroup
	var pubErr error
	pubDone := make(chan struct{})
	pubWG.Add(1)
	go func() {
		defer pubWG.Done()
		defer close(pubDone)
		const chunk = 250
		chunks := (len(pl.deliveries) + chunk - 1) / chunk
		pace := o.publishOver / time.Duration(max(chunks, 1))
		for i := 0; i < len(pl.deliveries); i += chunk {
			n, err := ops.publish(runCtx, pl.deliveries[i:min(i+chunk, len(pl.deliveries))])
			rep.published += n
			if err != nil {
				pubErr = err
				return
			}
			if err := sleepCtx(runCtx, pace); err != nil {
				pubErr = err
				return
			}
		}
	}()

	// Chaos: SIGKILL a random consumer every 1-3 s and restart it; restart
	// Postgres after a third of the kills and disrupt the broker after two
	// thirds, and keep going until the publisher is done too.
	pgAt, brokerAt := max(1, o.minKills/3), max(2, 2*o.minKills/3)
	chaosErr := func() error {
		for {
			kills := sup.stats().kills
			select {
			case <-pubDone:
				if kills >= o.minKills && (o.pgRestart == "" || rep.pgRestarts > 0) && rep.brokerDisruptions > 0 {
					return nil
				}
			default:
			}
			wait := o.killMin + rand.N(o.killMax-o.killMin+1) //nolint:gosec // timing jitter
			if err := sleepCtx(runCtx, wait); err != nil {
				return fmt.Errorf("chaos phase: %w (kills so far %d)", err, kills)
			}
			victim := rng.IntN(o.consumers)
			if err := sup.kill(victim); err != nil {
				return err
			}
			kills = sup.stats().kills
			o.logf("   [%s] SIGKILL consumer %d (kill %d), restarted", elapsed(), victim, kills)
			if o.pgRestart != "" && rep.pgRestarts == 0 && kills >= pgAt {
				took, err := restartPostgres(runCtx, o.pgRestart, pool)
				if err != nil {
					return err
				}
				rep.pgRestarts++
				o.logf("   [%s] restarted Postgres (%s, back after %s)", elapsed(), o.pgRestart, took.Round(time.Millisecond))
			}
			if rep.brokerDisruptions == 0 && kills >= brokerAt {
				what, err := ops.disrupt(runCtx)
				if err != nil {
					return err
				}
				rep.brokerDisruptions++
				o.logf("   [%s] broker disrupted: %s", elapsed(), what)
			}
		}
	}()
	if chaosErr != nil {
		cancel()
		pubWG.Wait()
		return chaosErr
	}
	pubWG.Wait()
	if pubErr != nil {
		return fmt.Errorf("publish: %w", pubErr)
	}
	st := sup.stats()
	rep.kills, rep.unexpected, rep.consumerStarts = st.kills, st.unexpected, st.started
	o.logf("   chaos over: %d SIGKILLs, %d consumer exits restarted by the supervisor; draining", st.kills, st.unexpected)

	// Drain: every order applied, every bad message poisoned, nothing left
	// for the group/queue.
	drainStart := time.Now()
	ledger := func(ctx context.Context) (int, error) {
		var n int
		err := pool.QueryRow(ctx, fmt.Sprintf("SELECT count(DISTINCT order_id) FROM %s.point_ledger", pgx.Identifier{schema}.Sanitize())).Scan(&n)
		return n, err
	}
	var drainErr error
	for {
		n, err1 := ledger(runCtx)
		poisoned, err2 := ops.poisonedCount(runCtx)
		drained, err3 := ops.drained(runCtx)
		if err1 == nil && err2 == nil && err3 == nil && n >= o.orders && poisoned >= o.bad && drained {
			break
		}
		if err := sleepCtx(runCtx, 200*time.Millisecond); err != nil {
			drainErr = fmt.Errorf("drain: %w (applied %d of %d, poisoned %d of %d, drained %v; last errors: %w)",
				errTimeout, n, o.orders, poisoned, o.bad, drained, errors.Join(err1, err2, err3))
			break
		}
	}
	rep.drain = time.Since(drainStart)
	// Graceful stop lets in-flight duplicates finish (and Kafka commit),
	// so what is counted below is final.
	sup.stop(20 * time.Second)
	if st := sup.stats(); st.startErr != nil {
		return fmt.Errorf("supervisor: %w", st.startErr)
	}

	vctx, vcancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer vcancel()
	tally, err := orderfeed.Count(vctx, pool, schema)
	if err != nil {
		return err
	}
	rep.applied, rep.ledgerRows, rep.doubled, rep.gotPts = tally.Applied, tally.LedgerRows, tally.Doubled, tally.Points
	rep.lost = o.orders - rep.applied
	if rep.stuck, err = ops.remaining(vctx); err != nil {
		return fmt.Errorf("count remaining messages: %w", err)
	}
	ids, err := ops.poisonedIDs(vctx)
	if err != nil {
		return fmt.Errorf("read poisoned messages: %w", err)
	}
	rep.poisoned = len(ids)
	for _, id := range ids {
		if !strings.HasPrefix(id, "bad-") {
			rep.misPoisoned++
		}
	}
	return drainErr
}

// restartPostgres runs the restart command and waits until the server
// answers again.
func restartPostgres(ctx context.Context, command string, pool *pgxpool.Pool) (time.Duration, error) {
	start := time.Now()
	args := strings.Fields(command)
	out, err := exec.CommandContext(ctx, args[0], args[1:]...).CombinedOutput() //nolint:gosec // the operator's command
	if err != nil {
		return 0, fmt.Errorf("restart Postgres (%s): %w: %s", command, err, out)
	}
	if err := waitPostgres(ctx, pool); err != nil {
		return 0, err
	}
	return time.Since(start), nil
}

func waitPostgres(ctx context.Context, pool *pgxpool.Pool) error {
	for {
		if _, err := pool.Exec(ctx, "SELECT 1"); err == nil {
			return nil
		}
		if err := sleepCtx(ctx, 100*time.Millisecond); err != nil {
			return fmt.Errorf("postgres did not come back: %w", err)
		}
	}
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func retryDelay(attempt int) time.Duration {
	return min(100*time.Millisecond<<attempt, 2*time.Second)
}

var errTimeout = errors.New("timed out")
