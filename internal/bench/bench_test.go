//go:build bench

package bench

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"runtime"
	"runtime/pprof"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	// The benchmarks build AMQP and Kafka brokers through brokers.Config.
	_ "github.com/claimtx/claimtx/brokers/amqp"
	_ "github.com/claimtx/claimtx/brokers/kafka"
	"github.com/claimtx/claimtx/brokers/kafka/kafkatest"
)

type options struct {
	n           int
	concurrency []int
	brokers     []string
	databaseURL string
	amqpURL     string
	write       string
	modes       map[string]bool
	reps        int
}

// The options of TestBench, given after go test's -args.
var (
	flagN           = flag.Int("n", 3000, "messages per measurement (batch mode: 5x)")
	flagReps        = flag.Int("reps", 3, "runs of each measurement; the table shows the median")
	flagConcurrency = flag.String("concurrency", "1,4,16", "concurrency levels")
	flagBrokers     = flag.String("brokers", "amqp,kafka", "brokers")
	flagWrite       = flag.String("write", "", "write the results as Markdown to this file (e.g. docs/benchmarks.md)")
	flagMemory      = flag.Int("memory", 0, "instead of the table: feed this many messages through a claimtx consumer over RabbitMQ and sample its memory")
	flagMemoryMode  = flag.String("memory-mode", "message", "the consumer for -memory: message (router + claim middleware) or batch (consumer.NewBatch)")
	flagStorm       = flag.Int("storm", 0, "instead of the table: a duplicate storm of this many already-applied messages per run, claimtx per message and in batches against the broker's bare consume+ack rate")
	flagCPUProfile  = flag.String("cpuprofile", "", "write a CPU profile of the whole run to this file")
	// noPositions: the claim modes run with middleware.Claim.NoPositions
	// (Kafka stores no positions).
	noPositions          = flag.Bool("no-positions", false, "run claimtx without the Kafka positions stored with the claims (middleware.Claim.NoPositions), to measure what they cost")
	flagMaxGroup         = flag.Int("max-group", 0, "middleware.Claim.MaxGroup of the group mode (0: its default)")
	flagGroupWindow      = flag.Int("group-window", 16, "group mode: RabbitMQ messages in flight per unit of concurrency (AMQP_WINDOW = concurrency x this)")
	flagKafkaGroupWindow = flag.Int("kafka-group-window", 0, "group mode: Kafka messages in flight per partition (KAFKA_WINDOW; 0: one)")
	flagModes            = flag.String("modes", "", "modes to measure, a subset for quick looks (-write needs all): "+strings.Join(allModes, ",")+"; with -storm: "+strings.Join(stormModes, ","))
)

// TestBench is the whole tool: the table, or -storm, or -memory.
func TestBench(t *testing.T) {
	o, err := parseOptions()
	if err != nil {
		t.Fatal("bench:", err)
	}
	// go test runs a package's tests in its directory; the paths given
	// (-write docs/benchmarks.md) are the module root's.
	t.Chdir("../..")
	if *flagCPUProfile != "" {
		f, err := os.Create(*flagCPUProfile)
		if err == nil {
			err = pprof.StartCPUProfile(f)
		}
		if err != nil {
			t.Fatal("bench:", err)
		}
		defer pprof.StopCPUProfile()
	}
	ctx := context.Background()
	switch {
	case *flagStorm > 0:
		err = stormRun(ctx, o, *flagStorm)
	case *flagMemory > 0:
		err = memoryRun(ctx, o, *flagMemoryMode, *flagMemory)
	default:
		err = run(ctx, o)
	}
	if err != nil {
		t.Fatal("bench:", err)
	}
}

func parseOptions() (options, error) {
	o := options{n: *flagN, reps: *flagReps, write: *flagWrite, modes: map[string]bool{}}
	known := allModes
	if *flagStorm > 0 {
		known = stormModes
	}
	modes := *flagModes
	if modes == "" {
		modes = strings.Join(known, ",")
	}
	for _, m := range strings.Split(modes, ",") {
		m = strings.TrimSpace(m)
		if !slices.Contains(known, m) {
			return o, fmt.Errorf("unknown mode %q in -modes (known: %s)", m, strings.Join(known, ","))
		}
		o.modes[m] = true
	}
	if o.write != "" && len(o.modes) < len(allModes) {
		return o, errors.New("-write needs every mode")
	}
	for _, c := range strings.Split(*flagConcurrency, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(c))
		if err != nil || n < 1 {
			return o, fmt.Errorf("bad -concurrency %q", *flagConcurrency)
		}
		o.concurrency = append(o.concurrency, n)
	}
	o.brokers = strings.Split(*flagBrokers, ",")
	o.databaseURL = envOr("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable")
	o.amqpURL = envOr("AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")
	return o, nil
}

// allModes are the -modes, in the order one row's runs interleave.
var allModes = []string{"raw", "router", "claim", "ordered", "group", "hot", "hot-single", "natural", "batch", "hand"}

// session is what the measurements of one run share: the admin pool that
// drops each measurement's schema, and the in-process Kafka broker.
type session struct {
	ctx       context.Context
	o         options
	pool      *pgxpool.Pool
	kafkaAddr string
	stopKafka func()
}

func openSession(ctx context.Context, o options) (*session, error) {
	pool, err := pgxpool.New(ctx, o.databaseURL)
	if err != nil {
		return nil, err
	}
	addr, stop, err := startKafka(ctx, o)
	if err != nil {
		pool.Close()
		return nil, err
	}
	return &session{ctx: ctx, o: o, pool: pool, kafkaAddr: addr, stopKafka: stop}, nil
}

func (s *session) close() {
	s.stopKafka()
	s.pool.Close()
}

// measure runs f on a fresh schema and topic for concurrency c, prints its
// rate and drops the schema.
func (s *session) measure(label string, c int, f func(*env) (result, error)) (result, error) {
	env, err := newEnv(s.ctx, s.o.databaseURL, c)
	if err != nil {
		return result{}, err
	}
	r, err := f(env)
	env.close(s.ctx, s.pool)
	if err != nil {
		return result{}, fmt.Errorf("%s: %w", label, err)
	}
	extra := ""
	if r.batches > 0 {
		extra = fmt.Sprintf(" (avg batch %.1f)", r.avgBatch())
	}
	fmt.Fprintf(os.Stderr, "%-34s %8.0f msg/s%s\n", label, r.rate(), extra)
	return r, nil
}

// mode is one measurement of a row: a name of -modes and its run.
type mode struct {
	name string
	run  func(*env) (result, error)
}

// round measures each of modes that -modes selects once, in order,
// adding the results to runs by mode name.
func (s *session) round(label string, c int, modes []mode, runs map[string][]result) error {
	for _, m := range modes {
		if !s.o.modes[m.name] {
			continue
		}
		r, err := s.measure(label+" "+m.name, c, m.run)
		if err != nil {
			return err
		}
		runs[m.name] = append(runs[m.name], r)
	}
	return nil
}

// startKafka starts the in-process Kafka-protocol broker when o measures
// Kafka, and returns its address ("" otherwise) and how to stop it.
func startKafka(ctx context.Context, o options) (string, func(), error) {
	for _, b := range o.brokers {
		if b == "kafka" {
			br, err := kafkatest.Start(ctx, kafkatest.Options{Addr: "127.0.0.1:0", Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				return "", nil, err
			}
			return br.Addrs()[0], func() { _ = br.Close() }, nil
		}
	}
	return "", func() {}, nil
}

func envOr(k, d string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return d
}

type row struct {
	broker      string
	concurrency int
	raw         result
	router      result
	claim       result
	ordered     result
	group       result
	hot         result
	hotSingle   result
	natural     result
	batch       result
	hand        result
}

type result struct {
	n       int
	elapsed time.Duration
	lat     []time.Duration
	batches int // handler calls in batch mode
}

func (r result) avgBatch() float64 {
	if r.batches == 0 {
		return 0
	}
	return float64(r.n) / float64(r.batches)
}

func (r result) rate() float64 {
	if r.n == 0 {
		return 0
	}
	return float64(r.n) / r.elapsed.Seconds()
}

// median is the run with the median rate (the lower middle one for an
// even count); the zero result for none.
func median(rs []result) result {
	if len(rs) == 0 {
		return result{}
	}
	s := append([]result(nil), rs...)
	sort.Slice(s, func(i, j int) bool { return s[i].rate() < s[j].rate() })
	return s[(len(s)-1)/2]
}

// batchFactor: batch mode gets this many times -n messages, so that its
// runs, many times faster, last long enough to measure.
const batchFactor = 5

func (r result) pct(p float64) time.Duration {
	if len(r.lat) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), r.lat...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	i := int(p * float64(len(s)-1))
	return s[i]
}

func memoryRun(ctx context.Context, o options, mode string, n int) error {
	pool, err := pgxpool.New(ctx, o.databaseURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	c := o.concurrency[len(o.concurrency)-1]
	env, err := newEnv(ctx, o.databaseURL, c)
	if err != nil {
		return err
	}
	defer env.close(ctx, pool)
	samples, took, err := runMemory(ctx, env, o.amqpURL, mode, n, c)
	if err != nil {
		return err
	}
	fmt.Print(renderMemory(mode, samples, took))
	return nil
}

func run(ctx context.Context, o options) error {
	start := time.Now()
	sess, err := openSession(ctx, o)
	if err != nil {
		return err
	}
	defer sess.close()
	// Each measurement runs o.reps times, the modes of one row interleaved
	// (raw, router, claimtx, batch, hand, raw, router, …) so a disturbance
	// hits them alike; the table shows the median run of each.
	raws := map[int][]result{}
	var rows []row
	for _, b := range o.brokers {
		for _, c := range o.concurrency {
			base := routerRun{broker: b, n: o.n, concurrency: c, amqpURL: o.amqpURL, kafkaAddr: sess.kafkaAddr}
			modes := []mode{
				{"router", func(e *env) (result, error) { return runRouter(ctx, e, base) }},
				{"claim", func(e *env) (result, error) { r := base; r.claim = true; return runRouter(ctx, e, r) }},
				{"ordered", func(e *env) (result, error) { r := base; r.claim, r.ordered = true, true; return runRouter(ctx, e, r) }},
				{"group", func(e *env) (result, error) { r := base; r.claim, r.group = true, true; return runRouter(ctx, e, r) }},
				{"hot", func(e *env) (result, error) {
					r := base
					r.claim, r.group, r.customers = true, true, hotCustomers
					return runRouter(ctx, e, r)
				}},
				{"hot-single", func(e *env) (result, error) {
					r := base
					r.claim, r.customers = true, hotCustomers
					return runRouter(ctx, e, r)
				}},
				{"natural", func(e *env) (result, error) { r := base; r.claim, r.natural = true, true; return runRouter(ctx, e, r) }},
				{"batch", func(e *env) (result, error) {
					r := base
					r.n, r.workers = batchFactor*o.n, c
					return runBatch(ctx, e, r)
				}},
				{"hand", func(e *env) (result, error) { return runHand(ctx, e, base) }},
			}
			runs := map[string][]result{}
			for rep := 0; rep < o.reps; rep++ {
				if o.modes["raw"] && len(raws[c]) < o.reps {
					r, err := sess.measure(fmt.Sprintf("raw c=%d", c), c, func(env *env) (result, error) { return runRaw(ctx, env, o.n, c) })
					if err != nil {
						return err
					}
					raws[c] = append(raws[c], r)
				}
				if err := sess.round(fmt.Sprintf("%s c=%d", b, c), c, modes, runs); err != nil {
					return err
				}
			}
			rows = append(rows, row{broker: b, concurrency: c, raw: median(raws[c]), router: median(runs["router"]), claim: median(runs["claim"]),
				ordered: median(runs["ordered"]),
				group:   median(runs["group"]), hot: median(runs["hot"]), hotSingle: median(runs["hot-single"]),
				natural: median(runs["natural"]), batch: median(runs["batch"]), hand: median(runs["hand"])})
		}
	}
	table := render(rows)
	fmt.Print(table)
	if o.write != "" {
		return writeDoc(o, table, time.Since(start))
	}
	return nil
}

func render(rows []row) string {
	var b strings.Builder
	tableHead(&b, "broker", "conc", "(a) raw msg/s", "(b) router msg/s", "(c) claimtx msg/s", "(c) p50", "(c) p99", "(b) p99", "c/b", "c/a", "b/a", "(d) batch msg/s", "(d) avg batch", "d/c", "(h) msg/s", "(h) p99", "c/h", "d/h", "(n) msg/s", "(n) p99", "n/b")
	for _, r := range rows {
		fmt.Fprintf(&b, "| %s | %d | %.0f | %.0f | %.0f | %s | %s | %s | %.2f | %.2f | %.2f | %.0f | %.0f | %.1f | %.0f | %s | %.2f | %.1f | %.0f | %s | %.2f |\n",
			r.broker, r.concurrency, r.raw.rate(), r.router.rate(), r.claim.rate(),
			r.claim.pct(0.5).Round(10*time.Microsecond), r.claim.pct(0.99).Round(10*time.Microsecond),
			r.router.pct(0.99).Round(10*time.Microsecond),
			r.claim.rate()/r.router.rate(), r.claim.rate()/r.raw.rate(), r.router.rate()/r.raw.rate(),
			r.batch.rate(), r.batch.avgBatch(), r.batch.rate()/r.claim.rate(),
			r.hand.rate(), r.hand.pct(0.99).Round(10*time.Microsecond), r.claim.rate()/r.hand.rate(), r.batch.rate()/r.hand.rate(),
			r.natural.rate(), r.natural.pct(0.99).Round(10*time.Microsecond), r.natural.rate()/r.router.rate())
	}
	b.WriteString("\n")
	tableHead(&b, "broker", "conc", "(c) msg/s", "(c) p99", "(o) ordered msg/s", "(o) p99", "o/c", "(g) group msg/s", "(g) p50", "(g) p99", "g/c", "g/b", "g/h", "(k) hot-key msg/s", "(k) p99", "k/g", "(k1) hot-key per message msg/s", "k/k1")
	for _, r := range rows {
		fmt.Fprintf(&b, "| %s | %d | %.0f | %s | %.0f | %s | %.2f | %.0f | %s | %s | %.2f | %.2f | %.2f | %.0f | %s | %.2f | %.0f | %.2f |\n",
			r.broker, r.concurrency, r.claim.rate(), r.claim.pct(0.99).Round(10*time.Microsecond),
			r.ordered.rate(), r.ordered.pct(0.99).Round(10*time.Microsecond), r.ordered.rate()/r.claim.rate(),
			r.group.rate(), r.group.pct(0.5).Round(10*time.Microsecond), r.group.pct(0.99).Round(10*time.Microsecond),
			r.group.rate()/r.claim.rate(), r.group.rate()/r.router.rate(), r.group.rate()/r.hand.rate(),
			r.hot.rate(), r.hot.pct(0.99).Round(10*time.Microsecond), r.hot.rate()/r.group.rate(),
			r.hotSingle.rate(), r.hot.rate()/r.hotSingle.rate())
	}
	return b.String()
}

// tableHead writes the head of a Markdown table: the first column (the
// broker) left-aligned, the others (numbers) right-aligned.
func tableHead(b *strings.Builder, cols ...string) {
	fmt.Fprintf(b, "| %s |\n|---%s|\n", strings.Join(cols, " | "), strings.Repeat("|---:", len(cols)-1))
}

func machine() string {
	trim := func(b []byte, err error) string {
		if err != nil {
			return "?"
		}
		return strings.TrimSpace(string(b))
	}
	psql := trim(exec.Command("psql", "--version").Output())
	rabbit := trim(exec.Command("rabbitmqctl", "version").Output())
	mem := "?"
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		mem = strings.Fields(strings.SplitN(string(b), "\n", 2)[0])[1] + " kB"
	}
	cpu := "?"
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(l, "model name") {
				cpu = strings.TrimSpace(strings.SplitN(l, ":", 2)[1])
				break
			}
		}
	}
	return fmt.Sprintf("%d cores (%s), %s RAM, %s, %s, %s", runtime.NumCPU(), cpu, mem, runtime.Version(),
		psql, "RabbitMQ "+rabbit)
}

func writeDoc(o options, table string, took time.Duration) error {
	w := &strings.Builder{}
	fmt.Fprintf(w, "# Benchmarks\n\nRead this when you weigh what claimtx costs or gains against an at-least-once consumer and a hand-written one, per broker and mode. Measured by `make bench` (`%s`) on %s.\n\n",
		command(fmt.Sprintf("-n %d -reps %d -concurrency %s -brokers %s -write %s", o.n, o.reps, joinInts(o.concurrency), strings.Join(o.brokers, ","), o.write)),
		time.Now().UTC().Format("2006-01-02"))
	fmt.Fprintf(w, "Machine: %s. Postgres and RabbitMQ with their Debian defaults on loopback; Kafka is the in-process kfake dev broker.\n\n", machine())
	fmt.Fprintf(w, "%s\n", table)
	fmt.Fprintf(w, `| mode | what runs (every mode applies the loyalty effect: balance upsert + ledger row) |
|---|---|
| (a) raw | no broker: a goroutine per unit of concurrency loops BEGIN + claim INSERT (one pipelined batch), effect, COMMIT; the database's limit for one transaction per message |
| (b) router | a Watermill router over the adapter, the effect in its own transaction, no claim: an at-least-once consumer |
| (c) claimtx | (b) with the claim middleware, one transaction per message (MaxGroup 1) |
| (d) batch | consumer.NewBatch, the effect set-wise, up to 128 messages per transaction, 5x the messages; windows AMQP_WINDOW / KAFKA_WINDOW = 128 x workers; "avg batch" is messages per handler call |
| (h) hand-written | (c)'s guarantee on the broker's own client (amqp091-go channels with prefetch 1; a franz-go group, one goroutine per partition, marks committed every second), ack after commit |
| (g) group commit | (c) with the default MaxGroup 16: waiting messages share one transaction, each under its savepoint; RabbitMQ holds concurrency x 16 unacked, Kafka one record in flight per partition |
| (o) ordered | (c) with an order key and nothing parked: o/c is the parked-key lookup's cost |
| (k) hot key | (g) over 10 customers instead of 1,000, so groups contend and deadlock; (k1) the same keys per message |
| (n) natural key | (c) in ModeNaturalKey: the ledger's unique order_id is the claim |

p50/p99 are the handler chain per message ((h): decode and transaction, without the ack). Concurrency is the RabbitMQ subscription count ((h): channels) or the Kafka partition count. Every run checks exactly once (n claims, n ledger rows, the balances' sum, nothing left unacked or uncommitted). Every figure is the median of %d runs, the modes of one row interleaved; the whole run took %s. The ratios' targets are in the next section.
`, o.reps, took.Round(time.Second))
	// The hand-written analysis after the generated part survives a rerun.
	if old, err := os.ReadFile(o.write); err == nil {
		if i := strings.Index(string(old), keptMarker); i >= 0 {
			fmt.Fprintf(w, "\n%s", old[i:])
		}
	}
	return os.WriteFile(o.write, []byte(w.String()), 0o600)
}

// keptMarker starts the part of docs/benchmarks.md that -write keeps.
const keptMarker = "## Reading these numbers"

// command is the go test command line that runs TestBench with args.
func command(args string) string {
	return "go test -tags bench -run '^TestBench$' -count=1 -timeout 0 -v ./internal/bench/ -args " + args
}

func joinInts(xs []int) string {
	s := make([]string, len(xs))
	for i, x := range xs {
		s[i] = strconv.Itoa(x)
	}
	return strings.Join(s, ",")
}
