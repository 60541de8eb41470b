package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/claimtx/claimtx/examples/internal/orderfeed"
	"github.com/claimtx/claimtx/internal/storedefault"
	"github.com/claimtx/claimtx/internal/timing"
	"github.com/claimtx/claimtx/middleware"
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
	poisoned(ctx context.Context) ([]poisonedMsg, error)
	disrupt(ctx context.Context) (string, error)
	close()
}

// poisonedMsg is one message of the poison destination.
type poisonedMsg struct{ eventID, reason string }

// poisonReasonKey is the header middleware.Poison puts the reason in.
const poisonReasonKey = middleware.PoisonReasonKey

// report is the outcome of one broker's chaos run.
type report struct {
	broker                string
	mode                  string
	orders, bad           int
	published             int // deliveries sent, producer retries included
	planned               int
	redelivered, copies   int
	freshIDs, twins       int
	applied, ledgerRows   int
	lost, doubled, stuck  int
	poisoned, misPoisoned int
	badPoisoned           int // distinct injected bad messages found in the poison destination
	expectedPts, gotPts   int64
	kills, terms          int
	crashes, hung         int
	consumerStarts        int
	pgRestarts            int
	brokerDisruptions     int
	minKills, minTerms    int
	wantPGRestart         bool
	elapsed, drain        time.Duration
	err                   error
}

func (r report) ok() bool {
	return r.err == nil && r.applied == r.orders && r.ledgerRows == r.orders && r.lost == 0 &&
		r.doubled == 0 && r.stuck == 0 && r.expectedPts == r.gotPts && r.badPoisoned == r.bad &&
		r.misPoisoned == 0 && r.crashes == 0 && r.hung == 0 &&
		r.kills >= r.minKills && r.terms >= r.minTerms && r.brokerDisruptions == 1 &&
		(!r.wantPGRestart || r.pgRestarts == 1)
}

// summary is the one line printed per broker. The verdict fields come
// first: lost, doubled, wrongly_poisoned and crashes must all be 0.
func (r report) summary() string {
	res := "OK"
	if !r.ok() {
		res = "FAIL"
		if r.err != nil {
			res += " (" + r.err.Error() + ")"
		}
	}
	return fmt.Sprintf("chaos %-5s %s: lost=%d doubled=%d wrongly_poisoned=%d crashes=%d hung_shutdowns=%d stuck=%d mode=%s "+
		"orders=%d deliveries=%d (redelivered=%d extra_copies=%d fresh_ids=%d twins=%d bad=%d) "+
		"applied=%d ledger_rows=%d poisoned=%d bad_poisoned=%d/%d points=%d/%d "+
		"sigkills=%d sigterms=%d consumer_starts=%d pg_restarts=%d broker_disruptions=%d elapsed=%s drain=%s",
		r.broker, res, r.lost, r.doubled, r.misPoisoned, r.crashes, r.hung, r.stuck, r.mode,
		r.orders, r.published, r.redelivered, r.copies, r.freshIDs, r.twins, r.bad,
		r.applied, r.ledgerRows, r.poisoned, r.badPoisoned, r.bad, r.gotPts, r.expectedPts,
		r.kills, r.terms, r.consumerStarts, r.pgRestarts, r.brokerDisruptions,
		r.elapsed.Round(100*time.Millisecond), r.drain.Round(100*time.Millisecond))
}

// consumerMode names the loyalty mode the environment selects: batch
// when BATCH_SIZE > 0 (make chaos-batch), per message otherwise.
func consumerMode() string {
	if n, err := strconv.Atoi(os.Getenv("BATCH_SIZE")); err == nil && n > 0 {
		return fmt.Sprintf("batch(size=%d,workers=%s)", n, orderfeed.EnvOr("BATCH_WORKERS", "2"))
	}
	return "per-message"
}

// runBroker runs the whole scenario against one broker.
func runBroker(ctx context.Context, o options, kind string) (rep report) {
	start := time.Now()
	mode := consumerMode()
	if kind == "amqp" {
		mode += " queue_type=" + o.amqpQueueType
	}
	rep = report{broker: kind, mode: mode, orders: o.orders, bad: o.bad,
		minKills: o.minKills, minTerms: o.minTerms, wantPGRestart: o.pgRestart != ""}
	defer func() { rep.elapsed = time.Since(start) }()
	if err := runScenario(ctx, o, kind, &rep); err != nil {
		rep.err = err
	}
	return rep
}

// freshDatabase creates an empty database for one broker's run and
// returns its URL and the function that drops it. A fresh database, not a
// schema: the loyalty tables live in the connection's default schema and
// the claim store in its own, and a real cold start finds neither.
func freshDatabase(ctx context.Context, o options, name string) (string, func(), error) {
	admin, err := pgxpool.New(ctx, o.databaseURL)
	if err != nil {
		return "", nil, err
	}
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		admin.Close()
		return "", nil, fmt.Errorf("create database %s: %w", name, err)
	}
	u, err := url.Parse(o.databaseURL)
	if err != nil {
		admin.Close()
		// The error would quote the URL, password included.
		return "", nil, errors.New("DATABASE_URL does not parse")
	}
	u.Path = "/" + name
	drop := func() {
		defer admin.Close()
		if o.keep {
			o.logf("   kept database %s", name)
			return
		}
		// The database goes even if Postgres is still coming back from
		// its restart; FORCE ends a straggler's session.
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		_ = waitPostgres(dctx, admin)
		if _, err := admin.Exec(dctx, "DROP DATABASE "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
			o.logf("   drop database %s: %v", name, err)
		}
	}
	return u.String(), drop, nil
}

func runScenario(ctx context.Context, o options, kind string, rep *report) error {
	id := orderfeed.RunID()
	dbName := fmt.Sprintf("chaos_%s_%s", kind, id)
	topic := fmt.Sprintf("chaos-orders-%s-%s", kind, id)
	group := "loyalty-chaos-" + id
	rng := rand.New(rand.NewPCG(o.seed, uint64(len(kind)))) //nolint:gosec // reproducible chaos, not secrets
	o.logf("== %s (%s): topic %s, fresh database %s, logs %s", kind, rep.mode, topic, dbName, o.logDir)
	start := time.Now()
	elapsed := func() string { return time.Since(start).Round(100 * time.Millisecond).String() }

	dbURL, dropDB, err := freshDatabase(ctx, o, dbName)
	if err != nil {
		return err
	}
	defer dropDB()
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	// The loyalty tables land in the default schema of the consumers'
	// connections, which is ours too.
	var schema string
	if err := pool.QueryRow(ctx, "SELECT current_schema()").Scan(&schema); err != nil {
		return err
	}

	var ops brokerOps
	var sup *supervisor // set below; the AMQP disruption asks it for the consumers' pids
	kafkaAddr, natsURL := "", ""
	switch kind {
	case "amqp":
		ops = &amqpOps{url: o.amqpURL, topic: topic, queueType: o.amqpQueueType, keep: o.keep, closeOwn: o.amqpDisrupt == "own",
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
	case "nats":
		proxy, err := startProxy(natsHostPort(o.natsURL))
		if err != nil {
			return fmt.Errorf("start the NATS proxy: %w", err)
		}
		nops := &natsOps{url: o.natsURL, topic: topic, keep: o.keep, proxy: proxy}
		natsURL = nops.consumerURL()
		ops = nops
	default:
		return fmt.Errorf("unknown broker %q", kind)
	}
	defer ops.close()
	if err := ops.prepare(ctx); err != nil {
		return err
	}

	env := append(os.Environ(),
		"BROKER="+kind, "DATABASE_URL="+dbURL, "CLAIMTX_SCHEMA="+storedefault.Schema, "TOPIC="+topic,
		"AMQP_URL="+o.amqpURL, "AMQP_QUEUE_TYPE="+o.amqpQueueType, "KAFKA_BROKERS="+kafkaAddr, "KAFKA_CONSUMER_GROUP="+group,
		// Short sessions: a SIGKILLed member's partitions move on within
		// seconds (and the dev broker evicts members killed mid-join).
		"KAFKA_SESSION_TIMEOUT=3s", "KAFKA_REBALANCE_TIMEOUT=3s",
		// NATS: through the runner's proxy (natsOps.disrupt); a killed
		// consumer's unacked messages come back after 5s, not 30s.
		"NATS_URL="+natsURL, "NATS_ACK_WAIT=5s",
		"CONCURRENCY=4", "METRICS_ADDR=127.0.0.1:0")
	sup = newSupervisor(o.loyalty, env, o.logDir, fmt.Sprintf("%s-%s", kind, id), o.consumers, o.logf)
	defer sup.stop(o.termTimeout)
	// Cold start: every consumer at once on the empty database, before
	// anything migrated it. A consumer that fails here is a crash.
	if err := sup.startAll(); err != nil {
		return err
	}
	o.logf("   [%s] cold start: %d consumers started at once on the empty database", elapsed(), o.consumers)

	pl := makePlan(o.orders, o.bad, rng)
	rep.planned, rep.redelivered, rep.copies, rep.freshIDs, rep.twins = len(pl.deliveries), pl.redelivered, pl.extraCopies, pl.freshIDs, pl.twins
	rep.expectedPts = pl.expectedPoints
	o.logf("   plan: %d deliveries: %d orders, %d redelivered with %d extra copies (%d with fresh broker ids, %d twins), %d bad",
		len(pl.deliveries), pl.orders, pl.redelivered, pl.extraCopies, pl.freshIDs, pl.twins, pl.bad)

	runCtx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()

	// Publish in chunks spread over the chaos phase, so kills, rolling
	// restarts, the Postgres restart and the broker disruption all hit a
	// busy system.
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
			if err := timing.Sleep(runCtx, pace); err != nil {
				pubErr = err
				return
			}
		}
		o.logf("   [%s] published all %d deliveries", elapsed(), len(pl.deliveries))
	}()

	// Chaos: every 1-3 s, SIGKILL a random consumer or give one a rolling
	// restart (SIGTERM, wait for its own exit, replace it), mixed at random
	// until each reached its minimum; restart Postgres after a third of
	// these steps and disrupt the broker after two thirds, and keep going
	// until the publisher is done too.
	ledgerRows := func(ctx context.Context) (int, error) {
		var n int
		err := pool.QueryRow(ctx, fmt.Sprintf("SELECT count(*) FROM %s.point_ledger", pgx.Identifier{schema}.Sanitize())).Scan(&n)
		return n, err
	}
	steps := o.minKills + o.minTerms
	pgAt, brokerAt := max(1, steps/3), max(2, 2*steps/3)
	chaosErr := func() error {
		for {
			st := sup.stats()
			select {
			case <-pubDone:
				if st.kills >= o.minKills && st.terms >= o.minTerms && (o.pgRestart == "" || rep.pgRestarts > 0) && rep.brokerDisruptions > 0 {
					return nil
				}
			default:
			}
			wait := o.killMin + rand.N(o.killMax-o.killMin+1) //nolint:gosec // timing jitter
			if err := timing.Sleep(runCtx, wait); err != nil {
				return fmt.Errorf("chaos phase: %w (SIGKILLs so far %d, SIGTERMs %d)", err, st.kills, st.terms)
			}
			victim := rng.IntN(o.consumers)
			needKills, needTerms := o.minKills-st.kills, o.minTerms-st.terms
			term := rng.IntN(max(needKills, 0)+max(needTerms, 0)+2) < max(needTerms, 0)+1
			if term {
				// A rolling restart that meets an idle consumer proves
				// little: once the victim consumes, wait (3 s at most)
				// until the consumers are at work (the ledger grows, or
				// the broker holds a backlog), so the SIGTERM lands while
				// messages are in flight.
				busy := func() error {
					by, prev := time.Now().Add(3*time.Second), -1
					for time.Now().Before(by) {
						if drained, err := ops.drained(runCtx); err == nil && !drained {
							return nil
						}
						if n, err := ledgerRows(runCtx); err == nil {
							if prev >= 0 && n > prev {
								return nil
							}
							prev = n
						}
						if err := timing.Sleep(runCtx, 25*time.Millisecond); err != nil {
							return err
						}
					}
					return nil
				}
				took, hung, done, err := sup.terminate(runCtx, victim, o.termTimeout, busy)
				if err != nil {
					return fmt.Errorf("chaos phase: rolling restart: %w", err)
				}
				if done {
					how := "exited by itself"
					if hung {
						how = "did NOT exit (hung shutdown), SIGKILLed"
					}
					o.logf("   [%s] SIGTERM consumer %d (rolling restart %d): %s after %s, replaced",
						elapsed(), victim, sup.stats().terms, how, took.Round(time.Millisecond))
				}
			} else {
				done, err := sup.kill(victim)
				if err != nil {
					return err
				}
				if done {
					o.logf("   [%s] SIGKILL consumer %d (kill %d), restarted", elapsed(), victim, sup.stats().kills)
				}
			}
			st = sup.stats()
			if o.pgRestart != "" && rep.pgRestarts == 0 && st.kills+st.terms >= pgAt {
				took, err := restartPostgres(runCtx, o.pgRestart, pool)
				if err != nil {
					return err
				}
				rep.pgRestarts++
				o.logf("   [%s] restarted Postgres (%s, back after %s)", elapsed(), o.pgRestart, took.Round(time.Millisecond))
			}
			if rep.brokerDisruptions == 0 && st.kills+st.terms >= brokerAt {
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
	o.logf("   chaos over: %d SIGKILLs, %d SIGTERM rolling restarts, %d crashes, %d hung shutdowns so far; draining",
		st.kills, st.terms, st.crashes, st.hung)

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
		if err := timing.Sleep(runCtx, 200*time.Millisecond); err != nil {
			drainErr = fmt.Errorf("drain: %w (applied %d of %d, poisoned %d of %d, drained %v; last errors: %w)",
				errTimeout, n, o.orders, poisoned, o.bad, drained, errors.Join(err1, err2, err3))
			break
		}
	}
	rep.drain = time.Since(drainStart)
	// Graceful stop lets in-flight duplicates finish (and Kafka commit),
	// so what is counted below is final. Its exits count like any other.
	sup.stop(o.termTimeout)
	st = sup.stats()
	rep.kills, rep.terms, rep.crashes, rep.hung, rep.consumerStarts = st.kills, st.terms, st.crashes, st.hung, st.started
	if st.startErr != nil {
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
	msgs, err := ops.poisoned(vctx)
	if err != nil {
		return fmt.Errorf("read poisoned messages: %w", err)
	}
	rep.poisoned = len(msgs)
	bad := map[string]bool{}
	wrongReasons := map[string]int{}
	for _, m := range msgs {
		if strings.HasPrefix(m.eventID, "bad-") {
			bad[m.eventID] = true
			continue
		}
		rep.misPoisoned++
		wrongReasons[m.reason]++
	}
	rep.badPoisoned = len(bad)
	for reason, n := range wrongReasons {
		o.logf("   WRONGLY POISONED: %d valid orders, reason %q", n, reason)
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
		if err := timing.Sleep(ctx, 100*time.Millisecond); err != nil {
			return fmt.Errorf("postgres did not come back: %w", err)
		}
	}
}

func retryDelay(attempt int) time.Duration {
	return min(100*time.Millisecond<<attempt, 2*time.Second)
}

var errTimeout = errors.New("timed out")
