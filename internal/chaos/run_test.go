package chaos

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/claimtx/claimtx/examples/loyalty/feed"
	"github.com/claimtx/claimtx/framework/cmd/claimtx/claimtxcli"
	"github.com/claimtx/claimtx/internal/pg"
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
	kills, terms          int // terms: rolling restarts of ready consumers
	startTerms, killTerms int // SIGTERMs of consumers while starting / 1-2 s after a SIGKILL
	finalTerms            int // SIGTERMs of the final stop
	midRebalance          int // Kafka: SIGTERMs (starting, after_kill) that met the group rebalancing; -1 elsewhere
	exits                 [termKinds][]time.Duration
	crashes, hung         int
	consumerStarts        int
	pgRestarts            int
	brokerDisruptions     int
	minKills, minTerms    int
	minStartTerms         int
	minKillTerms          int
	evictions             int // members the dev Kafka broker evicted; -1 when not counted
	// Order mode (CHAOS_ORDER=1): the consumers key orders by customer
	// and refuse the rejected orders for good; those are parked, then
	// skipped into the poison destination at the end (skips requests).
	ordered          bool
	rejected         int // orders refused for good (LOYALTY_REJECT_ORDERS)
	rejectedPoisoned int // distinct rejected orders found in the poison destination
	rejectedCredited int // distinct rejected orders in the ledger (must be 0)
	outOfOrder       int // per customer, pairs of ledger rows whose order ids are inverted against applied_seq
	parkedLeft       int // parked keys left at the end
	skips            int // `claimtx parked skip --all` requests
	wantPGRestart    bool
	elapsed, drain   time.Duration
	err              error
}

func (r report) ok() bool {
	want := r.orders - r.rejected
	if r.ordered && (r.outOfOrder != 0 || r.rejectedCredited != 0 || r.rejectedPoisoned != r.rejected || r.parkedLeft != 0) {
		return false
	}
	return r.err == nil && r.applied == want && r.ledgerRows == want && r.lost == 0 &&
		r.doubled == 0 && r.stuck == 0 && r.expectedPts == r.gotPts && r.badPoisoned == r.bad &&
		r.misPoisoned == 0 && r.crashes == 0 && r.hung == 0 &&
		r.kills >= r.minKills && r.terms >= r.minTerms &&
		r.startTerms >= r.minStartTerms && r.killTerms >= r.minKillTerms && r.brokerDisruptions == 1 &&
		(!r.wantPGRestart || r.pgRestarts == 1)
}

// summary is the one line printed per broker. The verdict fields come
// first: lost, doubled, wrongly_poisoned, crashes and hung_shutdowns must
// all be 0.
func (r report) summary() string {
	res := "OK"
	if !r.ok() {
		res = "FAIL"
		if r.err != nil {
			res += " (" + r.err.Error() + ")"
		}
	}
	var all []time.Duration
	for _, e := range r.exits {
		all = append(all, e...)
	}
	evictions, midRebalance := "", ""
	if r.evictions >= 0 {
		evictions = fmt.Sprintf(" evictions=%d", r.evictions)
	}
	if r.midRebalance >= 0 {
		midRebalance = fmt.Sprintf("; mid_rebalance=%d", r.midRebalance)
	}
	ordered := ""
	if r.ordered {
		ordered = fmt.Sprintf("out_of_order=%d rejected=%d rejected_poisoned=%d/%d rejected_credited=%d parked_left=%d skips=%d ",
			r.outOfOrder, r.rejected, r.rejectedPoisoned, r.rejected, r.rejectedCredited, r.parkedLeft, r.skips)
	}
	return fmt.Sprintf("chaos %-5s %s: lost=%d doubled=%d wrongly_poisoned=%d crashes=%d hung_shutdowns=%d %sstuck=%d mode=%s "+
		"orders=%d deliveries=%d (redelivered=%d extra_copies=%d fresh_ids=%d twins=%d bad=%d) "+
		"applied=%d ledger_rows=%d poisoned=%d bad_poisoned=%d/%d points=%d/%d "+
		"sigkills=%d sigterms=%d (ready=%d starting=%d after_kill=%d final=%d%s) sigterm_exit_p50=%s sigterm_exit_max=%s "+
		"consumer_starts=%d pg_restarts=%d broker_disruptions=%d%s elapsed=%s drain=%s",
		r.broker, res, r.lost, r.doubled, r.misPoisoned, r.crashes, r.hung, ordered, r.stuck, r.mode,
		r.orders, r.published, r.redelivered, r.copies, r.freshIDs, r.twins, r.bad,
		r.applied, r.ledgerRows, r.poisoned, r.badPoisoned, r.bad, r.gotPts, r.expectedPts,
		r.kills, r.terms+r.startTerms+r.killTerms+r.finalTerms, r.terms, r.startTerms, r.killTerms, r.finalTerms, midRebalance,
		roundDur(quantile(all, 0.5)), roundDur(quantile(all, 1)),
		r.consumerStarts, r.pgRestarts, r.brokerDisruptions, evictions,
		r.elapsed.Round(100*time.Millisecond), r.drain.Round(100*time.Millisecond))
}

// exitTimes is one line on how long the SIGTERMed consumers took to exit,
// per kind of SIGTERM.
func (r report) exitTimes() string {
	var b strings.Builder
	b.WriteString("   SIGTERM to exit:")
	for k, e := range r.exits {
		if k > 0 {
			b.WriteString(";")
		}
		if len(e) == 0 {
			fmt.Fprintf(&b, " %s n=0", termKind(k))
			continue
		}
		fmt.Fprintf(&b, " %s n=%d p50=%s max=%s", termKind(k), len(e), roundDur(quantile(e, 0.5)), roundDur(quantile(e, 1)))
	}
	return b.String()
}

// quantile is the q-quantile (nearest rank) of ds, 0 when ds is empty.
func quantile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(math.Ceil(q*float64(len(s)))) - 1
	return s[min(max(i, 0), len(s)-1)]
}

func roundDur(d time.Duration) time.Duration {
	if d < time.Second {
		return d.Round(time.Millisecond)
	}
	return d.Round(100 * time.Millisecond)
}

// consumerMode names the loyalty mode the environment selects: batch
// when BATCH_SIZE > 0 (make chaos-batch), per message otherwise; order
// mode (CHAOS_ORDER=1, make chaos-order) adds " ordered".
func consumerMode() string {
	m := "per-message"
	if n, err := strconv.Atoi(os.Getenv("BATCH_SIZE")); err == nil && n > 0 {
		workers := envOr("BATCH_WORKERS", "2")
		if orderMode() {
			workers = "1"
		}
		m = fmt.Sprintf("batch(size=%d,workers=%s)", n, workers)
	}
	if orderMode() {
		m += " ordered(key=customer)"
	}
	return m
}

// orderMode is CHAOS_ORDER=1 (make chaos-order): the consumers credit a
// customer's orders in delivery order (ORDER_KEY by customer, CONCURRENCY=1)
// and refuse a few orders for good (LOYALTY_REJECT_ORDERS), which park
// their customer's later orders until the run skips them at the end.
func orderMode() bool {
	v := os.Getenv("CHAOS_ORDER")
	return v != "" && v != "0" && v != "false"
}

// orderKeyTemplate keys the loyalty consumer's orders by customer.
const orderKeyTemplate = "template:customer-{payload.customer_id}"

// runBroker runs the whole scenario against one broker.
func runBroker(ctx context.Context, o options, kind string) (rep report) {
	start := time.Now()
	mode := consumerMode()
	if kind == "amqp" {
		mode += " queue_type=" + o.amqpQueueType
	}
	if kind == "kafka" {
		mode += " broker=" + o.kafkaBroker + " timeouts=" + kafkaTimeouts(o)
	}
	if o.pgbouncerHost != "" {
		mode += " postgres=pgbouncer"
	}
	rep = report{broker: kind, mode: mode, orders: o.orders, bad: o.bad,
		minKills: o.minKills, minTerms: o.minTerms, evictions: -1, midRebalance: -1, wantPGRestart: o.pgRestart != "",
		ordered: orderMode()}
	if kind == "kafka" {
		rep.midRebalance = 0
	}
	if slices.Contains(o.joinBrokers, kind) {
		rep.minStartTerms, rep.minKillTerms = o.minStartTerms, o.minKillTerms
	}
	defer func() { rep.elapsed = time.Since(start) }()
	if err := runScenario(ctx, o, kind, &rep); err != nil {
		rep.err = err
	}
	return rep
}

// kafkaTimeouts describes the Kafka consumers' session and rebalance
// timeouts: "default" unless shortened by flag.
func kafkaTimeouts(o options) string {
	if o.kafkaSession == 0 && o.kafkaRebalance == 0 {
		return "default"
	}
	d := func(v time.Duration) string {
		if v == 0 {
			return "default"
		}
		return v.String()
	}
	return "session:" + d(o.kafkaSession) + ",rebalance:" + d(o.kafkaRebalance)
}

// consumerEnv is the consumers' environment: the runner's own, without
// the Kafka timeouts (the flags set those), then the run's settings.
func consumerEnv(o options, settings ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "KAFKA_SESSION_TIMEOUT=") || strings.HasPrefix(kv, "KAFKA_REBALANCE_TIMEOUT=") {
			continue
		}
		env = append(env, kv)
	}
	env = append(env, settings...)
	if o.kafkaSession > 0 {
		env = append(env, "KAFKA_SESSION_TIMEOUT="+o.kafkaSession.String())
	}
	if o.kafkaRebalance > 0 {
		env = append(env, "KAFKA_REBALANCE_TIMEOUT="+o.kafkaRebalance.String())
	}
	return env
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
	id := feed.RunID()
	dbName := fmt.Sprintf("chaos_%s_%s", kind, id)
	topic := fmt.Sprintf("chaos-orders-%s-%s", kind, id)
	group := "loyalty-chaos-" + id
	rng := rand.New(rand.NewPCG(o.seed, uint64(len(kind)))) //nolint:gosec // reproducible chaos, not secrets
	ordered := orderMode()
	if ordered && kind == "amqp" && o.consumers > 1 {
		// Competing consumers on one queue interleave a customer's
		// orders: order mode runs one RabbitMQ consumer (still killed,
		// SIGTERMed and restarted). Kafka keeps several: a customer's
		// orders share a partition.
		o.logf("   order mode: 1 RabbitMQ consumer instead of %d (competing consumers on one queue would reorder a customer's orders)", o.consumers)
		o.consumers = 1
	}
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
	// The consumers' RabbitMQ connections carry the run's name (the only
	// setting of their CONFIG_FILE), so the disruption closes only them.
	amqpName, settings := "claimtx-chaos-"+id, []string(nil)
	var kops *kafkaOps
	kafkaAddr, natsURL := "", ""
	switch kind {
	case "amqp":
		cfgFile := filepath.Join(o.logDir, fmt.Sprintf("amqp-%s-config.yaml", id))
		if err := os.WriteFile(cfgFile, []byte("broker:\n  amqp:\n    connection_name: "+amqpName+"\n"), 0o600); err != nil {
			return err
		}
		settings = append(settings, "CONFIG_FILE="+cfgFile)
		ops = &amqpOps{url: o.amqpURL, topic: topic, queueType: o.amqpQueueType, keep: o.keep, closeOwn: o.amqpDisrupt == "own",
			connName: amqpName}
	case "kafka":
		if kafkaAddr, err = freeAddr(); err != nil {
			return err
		}
		dataDir, err := os.MkdirTemp("", "chaos-devkafka-")
		if err != nil {
			return err
		}
		defer func() { _ = os.RemoveAll(dataDir) }()
		var server kafkaServer
		if o.kafkaBroker == "kfake" {
			server = &kfakeServer{addr: kafkaAddr, dataDir: dataDir,
				logPath: filepath.Join(o.logDir, fmt.Sprintf("kafka-%s-kfake.log", id))}
		} else {
			server = &devKafka{bin: o.devkafka, addr: kafkaAddr, dataDir: dataDir,
				logPath: filepath.Join(o.logDir, fmt.Sprintf("kafka-%s-devkafka.log", id))}
		}
		kops = &kafkaOps{topic: topic, group: group, addr: kafkaAddr, broker: server, byCustomer: ordered}
		ops = kops
		defer func() { rep.evictions = server.evictions() }()
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

	consumerDB, err := consumerDatabaseURL(o, dbURL)
	if err != nil {
		return err
	}
	var rejected []int64
	concurrency := "CONCURRENCY=4"
	if ordered {
		rejected = rejectOrders(o.orders, orderBurst)
		ids := make([]string, len(rejected))
		for i, id := range rejected {
			ids[i] = strconv.FormatInt(id, 10)
		}
		concurrency = "CONCURRENCY=1"
		settings = append(settings, "ORDER_KEY="+orderKeyTemplate, "LOYALTY_REJECT_ORDERS="+strings.Join(ids, ","))
		if os.Getenv("BATCH_SIZE") != "" {
			settings = append(settings, "BATCH_WORKERS=1") // an order key's batches apply one at a time
		}
		o.logf("   order mode: ORDER_KEY=%s, CONCURRENCY=1, LOYALTY_REJECT_ORDERS=%s", orderKeyTemplate, strings.Join(ids, ","))
	}
	rep.rejected = len(rejected)
	env := consumerEnv(o, append(settings,
		"BROKER="+kind, "DATABASE_URL="+consumerDB, "CLAIMTX_SCHEMA="+pg.DefaultSchema, "TOPIC="+topic,
		"AMQP_URL="+o.amqpURL, "AMQP_QUEUE_TYPE="+o.amqpQueueType, "KAFKA_BROKERS="+kafkaAddr, "KAFKA_CONSUMER_GROUP="+group,
		// Kafka: the example's default session and rebalance timeouts,
		// the ones a user runs, unless -kafka-session-timeout or
		// -kafka-rebalance-timeout shorten them (consumerEnv).
		// NATS: through the runner's proxy (natsOps.disrupt); a killed
		// consumer's unacked messages come back after 5s, not 30s.
		"NATS_URL="+natsURL, "NATS_ACK_WAIT=5s",
		concurrency, "METRICS_ADDR=127.0.0.1:0")...)
	sup := newSupervisor(o.loyalty, env, o.logDir, fmt.Sprintf("%s-%s", kind, id), o.consumers, o.logf)
	defer sup.stop(o.termTimeout)
	// Cold start: every consumer at once on the empty database, before
	// anything migrated it. A consumer that fails here is a crash.
	if err := sup.startAll(); err != nil {
		return err
	}
	o.logf("   [%s] cold start: %d consumers started at once on the empty database", elapsed(), o.consumers)

	burst := 1
	if ordered {
		burst = orderBurst
	}
	pl := makePlan(o.orders, o.bad, burst, rejected, rng)
	rep.planned, rep.redelivered, rep.copies, rep.freshIDs, rep.twins = len(pl.deliveries), pl.redelivered, pl.extraCopies, pl.freshIDs, pl.twins
	rep.expectedPts = pl.expectedPoints
	o.logf("   plan: %d deliveries: %d orders, %d redelivered with %d extra copies (%d with fresh broker ids, %d twins), %d bad",
		len(pl.deliveries), pl.orders, pl.redelivered, pl.extraCopies, pl.freshIDs, pl.twins, pl.bad)

	runCtx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	// Publishing is spread over about as long as the chaos steps take.
	publishOver := o.publishOver
	if publishOver == 0 {
		publishOver = time.Duration(o.minKills+o.minTerms+rep.minStartTerms+rep.minKillTerms) * (o.killMin + o.killMax) / 2
	}

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
		pace := publishOver / time.Duration(max(chunks, 1))
		for i := 0; i < len(pl.deliveries); i += chunk {
			n, err := ops.publish(runCtx, pl.deliveries[i:min(i+chunk, len(pl.deliveries))])
			rep.published += n
			if err != nil {
				pubErr = err
				return
			}
			if err := pg.Sleep(runCtx, pace); err != nil {
				pubErr = err
				return
			}
		}
		o.logf("   [%s] published all %d deliveries", elapsed(), len(pl.deliveries))
	}()

	// Chaos: every 1-3 s, SIGKILL a random consumer or give one a rolling
	// restart (SIGTERM, wait for its own exit, replace it), and on the
	// -join-brokers SIGTERM consumers still joining: one restarted a moment
	// ago, or another one 1-2 s after a SIGKILL. The kinds are mixed at
	// random until each reached its minimum; restart Postgres after a third
	// of these steps and disrupt the broker after two thirds, and keep
	// going until the publisher is done too.
	ledgerRows := func(ctx context.Context) (int, error) {
		var n int
		err := pool.QueryRow(ctx, fmt.Sprintf("SELECT count(*) FROM %s.point_ledger", pgx.Identifier{schema}.Sanitize())).Scan(&n)
		return n, err
	}
	// busy returns once the consumers are at work (the ledger grows, or
	// the broker holds a backlog), 3 s at most: a rolling restart that
	// meets an idle consumer proves little.
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
			if err := pg.Sleep(runCtx, 25*time.Millisecond); err != nil {
				return err
			}
		}
		return nil
	}
	// state describes consumer p at the moment of its SIGTERM: how long it
	// has run, whether it subscribed yet (it logged readyMark: its router
	// runs; on Kafka the group join follows) and, on Kafka, the group's
	// state; a SIGTERM that meets a rebalancing group is counted.
	state := func(p *proc) string {
		consuming := "not subscribed yet"
		if b, err := os.ReadFile(filepath.Clean(p.logPath)); err == nil && bytes.Contains(b, readyMark) {
			consuming = "subscribed"
		}
		out := fmt.Sprintf("up %s, %s", time.Since(p.started).Round(time.Millisecond), consuming)
		if kops != nil {
			desc, rebalancing := kops.groupState(runCtx)
			out += ", " + desc
			if rebalancing {
				rep.midRebalance++
			}
		}
		return out
	}
	// readyTerm is a rolling restart of a consumer that consumes, while
	// the consumers are at work.
	readyTerm := func(victim int) (bool, error) {
		var sigAt string
		took, hung, done, err := sup.terminate(runCtx, victim, o.termTimeout, termReady, func(p *proc) error {
			if err := awaitReady(runCtx, p, readyTimeout); err != nil {
				return err
			}
			err := busy()
			sigAt = elapsed()
			return err
		})
		if err != nil {
			return false, fmt.Errorf("chaos phase: rolling restart: %w", err)
		}
		if done {
			o.logf("   [%s] SIGTERM consumer %d (rolling restart %d): %s, replaced",
				sigAt, victim, sup.stats().terms[termReady], exitHow(took, hung))
		}
		return done, nil
	}
	kill := func(victim int) (bool, error) {
		done, err := sup.kill(victim)
		if err != nil {
			return false, err
		}
		if done {
			o.logf("   [%s] SIGKILL consumer %d (kill %d), restarted", elapsed(), victim, sup.stats().kills)
		}
		return done, nil
	}
	joining := rep.minStartTerms > 0 || rep.minKillTerms > 0
	steps := o.minKills + o.minTerms + rep.minStartTerms + rep.minKillTerms
	pgAt, brokerAt := max(1, steps/3), max(2, 2*steps/3)
	stepsDone := 0
	chaosErr := func() error {
		for {
			st := sup.stats()
			select {
			case <-pubDone:
				if st.kills >= o.minKills && st.terms[termReady] >= o.minTerms &&
					st.terms[termStarting] >= rep.minStartTerms && st.terms[termAfterKill] >= rep.minKillTerms &&
					(o.pgRestart == "" || rep.pgRestarts > 0) && rep.brokerDisruptions > 0 {
					return nil
				}
			default:
			}
			wait := o.killMin + rand.N(o.killMax-o.killMin+1) //nolint:gosec // timing jitter
			if err := pg.Sleep(runCtx, wait); err != nil {
				return fmt.Errorf("chaos phase: %w (SIGKILLs so far %d, SIGTERMs %d ready, %d starting, %d after a SIGKILL)",
					err, st.kills, st.terms[termReady], st.terms[termStarting], st.terms[termAfterKill])
			}
			victim := rng.IntN(o.consumers)
			// Each kind is weighted by what it still lacks (plus one, so
			// every kind keeps coming once its minimum is met).
			wKill, wTerm := max(o.minKills-st.kills, 0)+1, max(o.minTerms-st.terms[termReady], 0)+1
			wStart, wAfterKill := 0, 0
			if joining {
				wStart = max(rep.minStartTerms-st.terms[termStarting], 0) + 1
				wAfterKill = max(rep.minKillTerms-st.terms[termAfterKill], 0) + 1
			}
			var done bool
			var err error
			switch r := rng.IntN(wKill + wTerm + wStart + wAfterKill); {
			case r < wTerm:
				done, err = readyTerm(victim)
			case r < wTerm+wKill:
				done, err = kill(victim)
			case r < wTerm+wKill+wStart:
				// Restart the victim (a SIGKILL, or a rolling restart),
				// then SIGTERM its replacement while it starts: as soon as
				// it logs (it is subscribing, before it joined the group),
				// or up to 3 s after it began consuming (while the group
				// rebalances for it).
				if rng.IntN(2) == 0 {
					done, err = kill(victim)
				} else {
					done, err = readyTerm(victim)
				}
				if err != nil || !done {
					break
				}
				early := rng.IntN(2) == 0
				delay := time.Duration(rng.Int64N(int64(3 * time.Second)))
				var when, sigAt string
				took, hung, ok, terr := sup.terminate(runCtx, victim, o.termTimeout, termStarting, func(p *proc) error {
					if err := awaitLogged(runCtx, p, readyTimeout); err != nil {
						return err
					}
					if !early {
						if err := awaitReady(runCtx, p, readyTimeout); err != nil {
							return err
						}
						if err := pg.Sleep(runCtx, delay); err != nil {
							return err
						}
					}
					sigAt, when = elapsed(), state(p)
					return nil
				})
				if terr != nil {
					return fmt.Errorf("chaos phase: SIGTERM while starting: %w", terr)
				}
				if ok {
					o.logf("   [%s] SIGTERM consumer %d while starting (%d; %s): %s, replaced",
						sigAt, victim, sup.stats().terms[termStarting], when, exitHow(took, hung))
				}
			default:
				// A rolling deploy that meets a crash: SIGKILL the victim,
				// restart it, and 1-2 s later SIGTERM another consumer,
				// while the group rebalances.
				killedAt := time.Now()
				if done, err = kill(victim); err != nil || !done {
					break
				}
				other := victim
				if o.consumers > 1 {
					other = (victim + 1 + rng.IntN(o.consumers-1)) % o.consumers
				}
				due := killedAt.Add(time.Second + time.Duration(rng.Int64N(int64(time.Second))))
				var when, sigAt string
				took, hung, ok, terr := sup.terminate(runCtx, other, o.termTimeout, termAfterKill, func(p *proc) error {
					if err := pg.Sleep(runCtx, time.Until(due)); err != nil {
						return err
					}
					if err := awaitLogged(runCtx, p, readyTimeout); err != nil {
						return err
					}
					sigAt = elapsed()
					when = fmt.Sprintf("%s after the SIGKILL of consumer %d; %s", time.Since(killedAt).Round(time.Millisecond), victim, state(p))
					return nil
				})
				if terr != nil {
					return fmt.Errorf("chaos phase: SIGTERM after a SIGKILL: %w", terr)
				}
				if ok {
					o.logf("   [%s] SIGTERM consumer %d after a SIGKILL (%d; %s): %s, replaced",
						sigAt, other, sup.stats().terms[termAfterKill], when, exitHow(took, hung))
				}
			}
			if err != nil {
				return err
			}
			if done {
				stepsDone++
			}
			if o.pgRestart != "" && rep.pgRestarts == 0 && stepsDone >= pgAt {
				pgAtStart := time.Now()
				took, err := restartPostgres(runCtx, o, pool)
				if err != nil {
					return err
				}
				rep.pgRestarts++
				o.logf("   [%s] restarted Postgres (%s, back after %s; %s)", elapsed(), o.pgRestart, took.Round(time.Millisecond), firstCommit(runCtx, ledgerRows, pgAtStart))
			}
			if rep.brokerDisruptions == 0 && stepsDone >= brokerAt {
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
	o.logf("   [%s] chaos over: %d SIGKILLs, %d SIGTERM rolling restarts, %d SIGTERMs while starting, %d after a SIGKILL; %d crashes, %d hung shutdowns so far; draining",
		elapsed(), st.kills, st.terms[termReady], st.terms[termStarting], st.terms[termAfterKill], st.crashes, st.hung)

	// Drain: every order applied, every bad message poisoned, nothing left
	// for the group/queue.
	drainStart := time.Now()
	ledger := func(ctx context.Context) (int, error) {
		var n int
		err := pool.QueryRow(ctx, fmt.Sprintf("SELECT count(DISTINCT order_id) FROM %s.point_ledger", pgx.Identifier{schema}.Sanitize())).Scan(&n)
		return n, err
	}
	var drainErr error
	for !ordered {
		n, err1 := ledger(runCtx)
		poisoned, err2 := ops.poisonedCount(runCtx)
		drained, err3 := ops.drained(runCtx)
		if err1 == nil && err2 == nil && err3 == nil && n >= o.orders && poisoned >= o.bad && drained {
			break
		}
		if err := pg.Sleep(runCtx, 200*time.Millisecond); err != nil {
			drainErr = fmt.Errorf("drain: %w (applied %d of %d, poisoned %d of %d, drained %v)",
				errTimeout, n, o.orders, poisoned, o.bad, drained)
			if last := errors.Join(err1, err2, err3); last != nil {
				drainErr = fmt.Errorf("%w; last errors: %w", drainErr, last)
			}
			break
		}
	}
	if ordered {
		rep.skips, drainErr = settleOrdered(runCtx, o, ops, pool, schema, dbURL, o.orders-len(rejected), o.bad+len(rejected), elapsed)
	}
	rep.drain = time.Since(drainStart)
	// Graceful stop lets in-flight duplicates finish (and Kafka commit),
	// so what is counted below is final. Its exits count like any other.
	sup.stop(o.termTimeout)
	st = sup.stats()
	rep.kills, rep.crashes, rep.hung, rep.consumerStarts = st.kills, st.crashes, st.hung, st.started
	rep.terms, rep.startTerms, rep.killTerms, rep.finalTerms = st.terms[termReady], st.terms[termStarting], st.terms[termAfterKill], st.terms[termFinal]
	rep.exits = st.exits
	o.logf("%s", rep.exitTimes())
	if st.startErr != nil {
		return fmt.Errorf("supervisor: %w", st.startErr)
	}

	vctx, vcancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer vcancel()
	tally, err := feed.Count(vctx, pool, schema)
	if err != nil {
		return err
	}
	rep.applied, rep.ledgerRows, rep.doubled, rep.gotPts = tally.Applied, tally.LedgerRows, tally.Doubled, tally.Points
	rep.lost = o.orders - rep.applied
	refused := map[string]bool{}
	if ordered {
		if err := checkOrdered(vctx, pool, schema, rejected, rep); err != nil {
			return err
		}
		// The rejected orders credited (must be none) are not counted
		// against the others.
		rep.lost = o.orders - len(rejected) - (rep.applied - rep.rejectedCredited)
		for _, id := range rejected {
			refused[fmt.Sprintf("evt-%d", id)] = true
		}
	}
	if rep.stuck, err = ops.remaining(vctx); err != nil {
		return fmt.Errorf("count remaining messages: %w", err)
	}
	msgs, err := ops.poisoned(vctx)
	if err != nil {
		return fmt.Errorf("read poisoned messages: %w", err)
	}
	rep.poisoned = len(msgs)
	bad, rejectedPoisoned := map[string]bool{}, map[string]bool{}
	wrongReasons := map[string]int{}
	for _, m := range msgs {
		if strings.HasPrefix(m.eventID, "bad-") {
			bad[m.eventID] = true
			continue
		}
		if refused[m.eventID] {
			// Refused for good, parked, then skipped: expected poison.
			rejectedPoisoned[m.eventID] = true
			continue
		}
		rep.misPoisoned++
		wrongReasons[m.reason]++
	}
	rep.badPoisoned, rep.rejectedPoisoned = len(bad), len(rejectedPoisoned)
	for reason, n := range wrongReasons {
		o.logf("   WRONGLY POISONED: %d valid orders, reason %q", n, reason)
	}
	return drainErr
}

// restartPostgres restarts the private cluster, or runs the restart
// command, and waits until the server answers again.
func restartPostgres(ctx context.Context, o options, pool *pgxpool.Pool) (time.Duration, error) {
	start := time.Now()
	if o.pgCluster != nil {
		if err := o.pgCluster.Restart(ctx); err != nil {
			return 0, fmt.Errorf("restart Postgres: %w", err)
		}
	} else {
		args := strings.Fields(o.pgRestart)
		out, err := exec.CommandContext(ctx, args[0], args[1:]...).CombinedOutput() //nolint:gosec // the operator's command
		if err != nil {
			return 0, fmt.Errorf("restart Postgres (%s): %w: %s", o.pgRestart, err, out)
		}
	}
	if err := waitPostgres(ctx, pool); err != nil {
		return 0, err
	}
	return time.Since(start), nil
}

// firstCommit says when, counted from since (the disruption), the
// consumers committed again: the first ledger row after Postgres answers,
// on a cluster the new primary's first commit. It waits 30 s at most, as
// a run near its end may have nothing left to commit.
func firstCommit(ctx context.Context, ledgerRows func(context.Context) (int, error), since time.Time) string {
	n0, err := ledgerRows(ctx)
	if err != nil {
		return "first commit unknown: " + err.Error()
	}
	for by := time.Now().Add(30 * time.Second); time.Now().Before(by); {
		if n, err := ledgerRows(ctx); err == nil && n > n0 {
			return fmt.Sprintf("first consumer commit %s after the disruption began", time.Since(since).Round(10*time.Millisecond))
		}
		if pg.Sleep(ctx, 20*time.Millisecond) != nil {
			break
		}
	}
	return "no consumer commit within 30 s of Postgres answering"
}

func waitPostgres(ctx context.Context, pool *pgxpool.Pool) error {
	for {
		if _, err := pool.Exec(ctx, "SELECT 1"); err == nil {
			return nil
		}
		if err := pg.Sleep(ctx, 100*time.Millisecond); err != nil {
			return fmt.Errorf("postgres did not come back: %w", err)
		}
	}
}

// exitHow says how a SIGTERMed consumer ended.
func exitHow(took time.Duration, hung bool) string {
	if hung {
		return fmt.Sprintf("did NOT exit within %s (hung shutdown), SIGKILLed", took.Round(time.Millisecond))
	}
	return fmt.Sprintf("exited by itself after %s", took.Round(time.Millisecond))
}

// publishRetrying runs once, which sends a whole batch and returns how
// many deliveries it sent, until it succeeds, up to 20 times with
// retryDelay between: a batch that failed part way is sent again whole.
// It returns the deliveries sent over all attempts.
func publishRetrying(ctx context.Context, broker string, once func() (int, error)) (int, error) {
	sent := 0
	var lastErr error
	for attempt := 0; attempt < 20; attempt++ {
		if err := ctx.Err(); err != nil {
			return sent, err
		}
		n, err := once()
		sent += n
		if err == nil {
			return sent, nil
		}
		lastErr = err
		if err := pg.Sleep(ctx, retryDelay(attempt)); err != nil {
			return sent, err
		}
	}
	return sent, fmt.Errorf("publish to %s: %w", broker, lastErr)
}

func retryDelay(attempt int) time.Duration {
	return min(100*time.Millisecond<<attempt, 2*time.Second)
}

var errTimeout = errors.New("timed out")

// settleOrdered is order mode's drain. The rejected orders park their
// customers' later orders, so the ledger stops short until they are
// released: once the broker is drained and the ledger, the parked
// messages and the poison destination have not moved for 2 s, it asks the
// running consumers to skip every parked key's head (`claimtx parked skip
// --all`, as an operator would) and waits again. A skip can release a
// key into a later rejected order of the same customer, which parks it
// anew: it repeats until no key is parked, want orders are credited and
// wantPoison messages poisoned. It returns the skip requests.
func settleOrdered(ctx context.Context, o options, ops brokerOps, pool *pgxpool.Pool, schema, dbURL string,
	want, wantPoison int, elapsed func() string) (int, error) {
	skips := 0
	var last [4]int
	stableSince := time.Now()
	for {
		var n, keys, rows int
		err1 := pool.QueryRow(ctx, fmt.Sprintf(`SELECT (SELECT count(DISTINCT order_id) FROM %[1]s.point_ledger),
			(SELECT count(*) FROM %[2]s.processed_messages_parked_keys), (SELECT count(*) FROM %[2]s.processed_messages_parked)`,
			pgx.Identifier{schema}.Sanitize(), pgx.Identifier{pg.DefaultSchema}.Sanitize())).Scan(&n, &keys, &rows)
		poisoned, err2 := ops.poisonedCount(ctx)
		drained, err3 := ops.drained(ctx)
		if err := errors.Join(err1, err2, err3); err == nil {
			if n >= want && poisoned >= wantPoison && drained && keys == 0 {
				return skips, nil
			}
			if cur := [4]int{n, keys, rows, poisoned}; cur != last {
				last, stableSince = cur, time.Now()
			}
			if drained && keys > 0 && time.Since(stableSince) >= 2*time.Second {
				var out, errOut bytes.Buffer
				code := claimtxcli.Run(ctx, claimtxcli.Config{}, []string{"parked", "skip", "--consumer", "loyalty", "--all",
					"--note", "chaos", "--database-url", dbURL, "--schema", pg.DefaultSchema}, &out, &errOut)
				skips++
				o.logf("   [%s] %d keys parked (%d messages), credited %d of %d: claimtx parked skip --all (%d): exit %d: %s",
					elapsed(), keys, rows, n, want, skips, code, strings.TrimSpace(out.String()+" "+errOut.String()))
				stableSince = time.Now()
			}
		}
		if err := pg.Sleep(ctx, 200*time.Millisecond); err != nil {
			return skips, fmt.Errorf("drain: %w (credited %d of %d, poisoned %d of %d, drained %v, %d keys parked, %d skips)",
				errTimeout, n, want, poisoned, wantPoison, drained, keys, skips)
		}
	}
}

// checkOrdered counts, in order mode, the rejected orders credited, the
// parked keys left, and out_of_order: per customer, the pairs of ledger
// rows credited (applied_seq) against their order ids.
func checkOrdered(ctx context.Context, pool *pgxpool.Pool, schema string, rejected []int64, rep *report) error {
	s := pgx.Identifier{schema}.Sanitize()
	err := pool.QueryRow(ctx, fmt.Sprintf(`SELECT
		(SELECT count(DISTINCT order_id) FROM %[1]s.point_ledger WHERE order_id = ANY($1)),
		(SELECT count(*) FROM %[2]s.processed_messages_parked_keys),
		(SELECT count(*) FROM %[1]s.point_ledger a JOIN %[1]s.point_ledger b
			ON a.customer_id = b.customer_id AND a.applied_seq < b.applied_seq AND a.order_id > b.order_id)`,
		s, pgx.Identifier{pg.DefaultSchema}.Sanitize()), rejected).Scan(&rep.rejectedCredited, &rep.parkedLeft, &rep.outOfOrder)
	if err != nil {
		return fmt.Errorf("check order: %w", err)
	}
	return nil
}
