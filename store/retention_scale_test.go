//go:build benchretention

// The retention scale benchmark: `make bench-retention`. It is a test
// behind a build tag, not a Go benchmark, because it measures one long
// scenario (load, then cleanup under load, then partition drops) rather
// than a loop; it is never part of `make test`.
//
//	go test -tags benchretention -run '^TestRetentionAtScale$' -count=1 -timeout 90m -v ./store/
//
// BENCH_ROWS (default 10000000) sets the number of claims loaded,
// BENCH_SECONDS (default 20) each steady-state measurement, BENCH_WORKERS
// (default 4) the concurrent claimers. BENCH_LAYOUT=shuffled scatters
// processed_at over the plain table's heap (the worst case for cleanup);
// BENCH_TARGET and BENCH_PAUSE override the cleanup's target batch duration
// and pause; BENCH_PARTITIONED=0 skips the partitioned half. Each table
// lives in its own schema, dropped at the end.
package store_test

import (
	"cmp"
	"context"
	"encoding/hex"
	"fmt"
	"os"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/internal/pg"
	"github.com/claimtx/claimtx/internal/testenv"
	"github.com/claimtx/claimtx/store"
)

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// splitmix64 is a bijection on uint64: distinct inputs give distinct,
// well-mixed outputs, so keys are unique and land all over the index like
// real event ids.
func splitmix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// claimRows generates n claims for 4 consumers with random keys (like
// event ids), processed uniformly over the last `days` days, each a few
// seconds after its event.
type claimRows struct {
	n, i        int
	days        int
	now         time.Time
	partitioned bool
	// shuffled scatters processed_at over the heap instead of appending in
	// time order: the worst case for cleanup (every deleted row on its own
	// page), as after a restore sorted by key.
	shuffled bool
	row      []any
}

var benchConsumers = []string{"loyalty", "analytics", "receipts", "search"}

func (r *claimRows) Next() bool {
	if r.i >= r.n {
		return false
	}
	h := splitmix64(uint64(r.i))
	var b [16]byte
	for j := range 8 {
		b[j] = byte(h >> (8 * j))
	}
	h2 := splitmix64(h)
	for j := range 8 {
		b[8+j] = byte(h2 >> (8 * j))
	}
	// Rows arrive in processed_at order, as a claim table grows (each
	// claim is inserted at now()): the heap is physically ordered by time,
	// which is what makes an old batch touch few pages. Event times are a
	// few seconds earlier.
	span := time.Duration(r.days) * 24 * time.Hour
	processed := r.now.Add(-span + time.Duration(float64(span)*float64(r.i)/float64(r.n)))
	if r.shuffled {
		processed = r.now.Add(-time.Duration(h2 % uint64(span)))
	}
	event := processed.Add(-time.Duration(h%5000) * time.Millisecond)
	r.row = []any{benchConsumers[r.i%len(benchConsumers)], "evt-" + hex.EncodeToString(b[:]), processed}
	if r.partitioned {
		r.row = append(r.row, pgtype.Date{Time: pg.EventDay(event), Valid: true})
	}
	r.i++
	return true
}

func (r *claimRows) Values() ([]any, error) { return r.row, nil }
func (r *claimRows) Err() error             { return nil }

// load copies n claims into st's table.
func load(st *store.Store, n, days int, partitioned bool, took *time.Duration) error {
	shuffled := os.Getenv("BENCH_LAYOUT") == "shuffled"
	cols := []string{"consumer", "message_key", "processed_at"}
	if partitioned {
		cols = append(cols, "event_day")
	}
	start := time.Now()
	got, err := st.Pool().CopyFrom(context.Background(), pgx.Identifier{st.Config().Schema, st.Config().ClaimsTable}, cols,
		&claimRows{n: n, days: days, now: time.Now(), partitioned: partitioned, shuffled: shuffled && !partitioned})
	*took = time.Since(start)
	if err != nil {
		return err
	}
	if got != int64(n) {
		return fmt.Errorf("copied %d rows, want %d", got, n)
	}
	return nil
}

// workload runs claimers until stop is closed and returns per-claim
// latencies (BEGIN through COMMIT).
type workload struct {
	latencies []time.Duration
	elapsed   time.Duration
}

func (w workload) throughput() float64 { return float64(len(w.latencies)) / w.elapsed.Seconds() }

func (w workload) percentile(p float64) time.Duration {
	if len(w.latencies) == 0 {
		return 0
	}
	s := slices.Clone(w.latencies)
	slices.Sort(s)
	return s[min(int(p*float64(len(s))), len(s)-1)]
}

func (w workload) String() string {
	return fmt.Sprintf("%d claims, %.0f claims/s, p50 %s, p99 %s, max %s", len(w.latencies), w.throughput(),
		w.percentile(0.50).Round(10*time.Microsecond), w.percentile(0.99).Round(10*time.Microsecond), w.percentile(1).Round(10*time.Microsecond))
}

// postmasterStart reads when the server (re)started, waiting for it to be
// up: the shared server of this repository is restarted by other jobs'
// chaos runs, and every phase below must survive that.
func postmasterStart(t *testing.T) time.Time {
	t.Helper()
	deadline := time.Now().Add(5 * time.Minute)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		conn, err := pgx.Connect(ctx, testenv.URL())
		var at time.Time
		if err == nil {
			err = conn.QueryRow(ctx, "SELECT pg_postmaster_start_time()").Scan(&at)
			_ = conn.Close(ctx)
		}
		cancel()
		if err == nil {
			return at
		}
		if time.Now().After(deadline) {
			t.Fatalf("server not back after 5 minutes: %v", err)
		}
		time.Sleep(time.Second) // polling a server that is restarting
	}
}

// restarted is a connection failure caused by the server going away.
func restarted(err error) bool { return pg.Classify(err) == pg.Connection }

// resilient runs fn until it succeeds, re-running it after a server restart
// (at most 5 times), and returns how many restarts interrupted it.
func resilient(t *testing.T, what string, fn func() error) int {
	t.Helper()
	for attempt := 0; ; attempt++ {
		err := fn()
		if err == nil {
			return attempt
		}
		if !restarted(err) || attempt == 5 {
			require.NoError(t, err, what)
		}
		t.Logf("%s interrupted by a server restart (%v); waiting and re-running", what, err)
		postmasterStart(t)
	}
}

func runClaimers(t *testing.T, st *store.Store, workers int, partitioned bool, stop <-chan struct{}) workload {
	t.Helper()
	ctx := context.Background()
	var mu sync.Mutex
	var all []time.Duration
	var wg sync.WaitGroup
	start := time.Now()
	seed := uint64(time.Now().UnixNano())
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var mine []time.Duration
			for i := uint64(0); ; i++ {
				select {
				case <-stop:
					mu.Lock()
					all = append(all, mine...)
					mu.Unlock()
					return
				default:
				}
				key := fmt.Sprintf("live-%x", splitmix64(seed+uint64(w)<<40+i))
				t0 := time.Now()
				err := pgx.BeginFunc(ctx, st.Pool(), func(tx pgx.Tx) error {
					var err error
					if partitioned {
						_, err = claimKeyAt(ctx, st, tx, "live", key, t0, 5*time.Second)
					} else {
						_, err = claimKey(ctx, st, tx, "live", key, 5*time.Second)
					}
					return err
				})
				if restarted(err) {
					time.Sleep(100 * time.Millisecond) // the server is restarting: back off, do not count it
					continue
				}
				if err != nil {
					t.Errorf("claim: %v", err)
					return
				}
				mine = append(mine, time.Since(t0))
			}
		}()
	}
	<-stop
	wg.Wait()
	return workload{latencies: all, elapsed: time.Since(start)}
}

// steady measures claimers for d, again if the server restarted meanwhile.
func steady(t *testing.T, st *store.Store, workers int, partitioned bool, d time.Duration) workload {
	for range 4 {
		before := postmasterStart(t)
		stop := make(chan struct{})
		time.AfterFunc(d, func() { close(stop) })
		w := runClaimers(t, st, workers, partitioned, stop)
		if postmasterStart(t).Equal(before) {
			return w
		}
		t.Log("server restarted during a measurement; measuring again")
	}
	t.Fatal("the server keeps restarting")
	return workload{}
}

// compare measures a and b in 8 interleaved rounds (ab, ba, ab, …) of
// d/8 each, so that bursts of foreign load on a shared machine hit both
// alike, and returns the pooled workloads and the median of the rounds'
// b/a throughput ratios (robust to one disturbed round).
func compare(t *testing.T, a, b *store.Store, workers int, partitioned bool, d time.Duration) (workload, workload, float64) {
	const rounds = 8
	var wa, wb workload
	var ratios []float64
	for r := range rounds {
		order := []*store.Store{a, b}
		if r%2 == 1 {
			order = []*store.Store{b, a}
		}
		var ra, rb workload
		for _, st := range order {
			w := steady(t, st, workers, partitioned, d/rounds)
			if st == a {
				ra = w
			} else {
				rb = w
			}
		}
		wa.latencies, wa.elapsed = append(wa.latencies, ra.latencies...), wa.elapsed+ra.elapsed
		wb.latencies, wb.elapsed = append(wb.latencies, rb.latencies...), wb.elapsed+rb.elapsed
		ratios = append(ratios, rb.throughput()/ra.throughput())
	}
	slices.Sort(ratios)
	return wa, wb, (ratios[rounds/2-1] + ratios[rounds/2]) / 2
}

// benchSchema is testenv.NewSchema plus a drop that retries for a minute:
// a shared server restarted by another job mid-run must not leave
// gigabytes of bench data behind.
func benchSchema(t *testing.T) string {
	t.Helper()
	schema := testenv.NewSchema(t)
	t.Cleanup(func() {
		for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(2 * time.Second) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			conn, err := pgx.Connect(ctx, testenv.URL())
			if err == nil {
				_, err = conn.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
				_ = conn.Close(ctx)
			}
			cancel()
			if err == nil {
				return
			}
		}
	})
	return schema
}

func benchStore(t *testing.T, workers int) *store.Store {
	t.Helper()
	schema := benchSchema(t)
	st, err := store.New(testenv.Pool(t, schema, int32(workers+3)), store.Config{Schema: schema})
	require.NoError(t, err)
	resilient(t, "migrate", func() error { return st.Migrate(context.Background()) })
	return st
}

func execTimed(st *store.Store, sql string, took *time.Duration) error {
	start := time.Now()
	_, err := st.Pool().Exec(context.Background(), sql)
	*took = time.Since(start)
	if err != nil {
		return fmt.Errorf("%s: %w", sql, err)
	}
	return nil
}

func TestRetentionAtScale(t *testing.T) {
	rows := envInt("BENCH_ROWS", 10_000_000)
	secs := time.Duration(envInt("BENCH_SECONDS", 20)) * time.Second
	workers := envInt("BENCH_WORKERS", 4)
	ctx := context.Background()
	var report []string
	say := func(format string, args ...any) {
		line := fmt.Sprintf(format, args...)
		report = append(report, line)
		t.Log(line)
	}
	defer func() {
		fmt.Println("\n=== retention benchmark ===")
		for _, l := range report {
			fmt.Println(l)
		}
	}()
	var version, sharedBuffers string
	resilient(t, "version", func() error {
		return testenv.Pool(t, benchSchema(t), 1).QueryRow(ctx, "SELECT version(), current_setting('shared_buffers')").Scan(&version, &sharedBuffers)
	})
	say("server: %s; shared_buffers %s; %d claimers; %d rows", version, sharedBuffers, workers, rows)

	// 1. Plain table: claim throughput empty vs full.
	empty := benchStore(t, workers)
	full := benchStore(t, workers)
	tbl := pgx.Identifier{full.Config().Schema, full.Config().ClaimsTable}.Sanitize()
	idx := pgx.Identifier{full.Config().Schema, "processed_messages_processed_at_idx"}.Sanitize()
	// Bulk load the way one restores a big table: without indexes, then
	// build them sorted.
	var copyTook, indexTook, vacuumTook time.Duration
	resilient(t, "load plain table", func() error {
		var d time.Duration
		if err := execTimed(full, "TRUNCATE "+tbl+"; ALTER TABLE "+tbl+" DROP CONSTRAINT IF EXISTS processed_messages_pkey; DROP INDEX IF EXISTS "+idx, &d); err != nil {
			return err
		}
		if err := load(full, rows, 60, false, &copyTook); err != nil {
			return err
		}
		if err := execTimed(full, "SET maintenance_work_mem = '1GB'; ALTER TABLE "+tbl+" ADD PRIMARY KEY (consumer, message_key); CREATE INDEX processed_messages_processed_at_idx ON "+tbl+" (processed_at); RESET maintenance_work_mem", &indexTook); err != nil {
			return err
		}
		return execTimed(full, "VACUUM (ANALYZE) "+tbl, &vacuumTook)
	})
	say("COPY %d claims (60 days of processed_at): %s (%.0f rows/s); index build %s; vacuum analyze %s",
		rows, copyTook.Round(time.Second), float64(rows)/copyTook.Seconds(), indexTook.Round(time.Second), vacuumTook.Round(time.Second))
	var stats store.Stats
	resilient(t, "stats", func() (err error) { stats, err = full.Stats(ctx); return err })
	say("table %d MiB + indexes %d MiB = %.0f bytes per claim", stats.TableBytes>>20, stats.IndexBytes>>20, stats.BytesPerClaim)

	wEmpty, wFull, median := compare(t, empty, full, workers, false, secs)
	say("plain, empty table:          %s", wEmpty)
	say("plain, %d claims present: %s", rows, wFull)
	say("=> claim throughput full/empty: %.2fx pooled, %.2fx median of 8 interleaved rounds (target >= 0.9x)", wFull.throughput()/wEmpty.throughput(), median)

	var dry store.CleanupResult
	resilient(t, "dry run", func() (err error) { dry, err = full.Cleanup(ctx, store.RetentionConfig{DryRun: true}); return err })
	say("dry run: %d claims older than 30 days, counted in %s", dry.WouldDelete, dry.Duration.Round(time.Millisecond))

	// 2. Cleanup with default settings while claimers run. A server
	// restart interrupts it; it resumes, as an operator's rerun would.
	stop := make(chan struct{})
	var during workload
	done := make(chan struct{})
	go func() { during = runClaimers(t, full, workers, false, stop); close(done) }()
	var batches, maxSize, minSize int
	minSize = 1 << 30
	var total store.CleanupResult
	ccfg := store.RetentionConfig{OnProgress: func(p store.CleanupResult) {
		maxSize, minSize = max(maxSize, p.NextBatchSize), min(minSize, p.NextBatchSize)
	}}
	if d, err := time.ParseDuration(os.Getenv("BENCH_TARGET")); err == nil {
		ccfg.TargetBatchDuration = d
	}
	if d, err := time.ParseDuration(os.Getenv("BENCH_PAUSE")); err == nil {
		ccfg.Pause = d
	}
	restarts := resilient(t, "cleanup", func() error {
		res, err := full.Cleanup(ctx, ccfg)
		total.Deleted += res.Deleted
		total.Duration += res.Duration
		batches += res.Batches
		return err
	})
	close(stop)
	<-done
	// The horizon moved on since the dry run: a few more claims aged out.
	require.GreaterOrEqual(t, total.Deleted, dry.WouldDelete)
	layout := "heap in processed_at order"
	if os.Getenv("BENCH_LAYOUT") == "shuffled" {
		layout = "heap shuffled"
	}
	say("cleanup (%s; batches toward %s, %s pause): %d claims in %s = %.0f rows/s wall, %d batches, batch size %d..%d, %d restarts survived",
		layout, cmp.Or(ccfg.TargetBatchDuration, pg.DefaultTargetBatchDuration), cmp.Or(ccfg.Pause, pg.DefaultBatchPause), total.Deleted, total.Duration.Round(time.Second), float64(total.Deleted)/total.Duration.Seconds(), batches, minSize, maxSize, restarts)
	say("plain, during cleanup:       %s", during)
	say("=> claim p99 during cleanup / without: %.2fx (target <= 2x)", float64(during.percentile(0.99))/float64(wFull.percentile(0.99)))
	if os.Getenv("BENCH_PARTITIONED") == "0" {
		return
	}

	// 3. Partitioned table: 10M claims over 60 event days.
	pEmpty := benchStore(t, workers)
	resilient(t, "enable partitioning", func() error {
		_, err := pEmpty.EnablePartitioning(ctx, store.RetentionConfig{})
		return err
	})
	pFull := benchStore(t, workers)
	resilient(t, "enable partitioning", func() error {
		_, err := pFull.EnablePartitioning(ctx, store.RetentionConfig{Retention: 61 * 24 * time.Hour})
		return err
	})
	ptbl := pgx.Identifier{pFull.Config().Schema, pFull.Config().ClaimsTable}.Sanitize()
	resilient(t, "load partitioned table", func() error {
		var d time.Duration
		if err := execTimed(pFull, "TRUNCATE "+ptbl+"; ALTER TABLE "+ptbl+" DROP CONSTRAINT IF EXISTS processed_messages_pkey", &d); err != nil {
			return err
		}
		if err := load(pFull, rows, 60, true, &copyTook); err != nil {
			return err
		}
		if err := execTimed(pFull, "SET maintenance_work_mem = '1GB'; ALTER TABLE "+ptbl+" ADD CONSTRAINT processed_messages_pkey PRIMARY KEY (consumer, message_key, event_day); RESET maintenance_work_mem", &indexTook); err != nil {
			return err
		}
		return execTimed(pFull, "VACUUM (ANALYZE) "+ptbl, &vacuumTook)
	})
	say("COPY %d claims into 60+ day partitions: %s (%.0f rows/s); primary keys built in %s; vacuum analyze %s",
		rows, copyTook.Round(time.Second), float64(rows)/copyTook.Seconds(), indexTook.Round(time.Second), vacuumTook.Round(time.Second))
	wPEmpty, wPFull, median := compare(t, pEmpty, pFull, workers, true, secs)
	say("partitioned, empty:          %s", wPEmpty)
	say("partitioned, %d claims:  %s", rows, wPFull)
	say("=> partitioned claim throughput full/empty: %.2fx pooled, %.2fx median of 8 interleaved rounds (target >= 0.9x)", wPFull.throughput()/wPEmpty.throughput(), median)

	stop = make(chan struct{})
	done = make(chan struct{})
	go func() { during = runClaimers(t, pFull, workers, true, stop); close(done) }()
	var dropped []store.Partition
	var dropTook time.Duration
	restarts = resilient(t, "drop expired", func() error {
		start := time.Now()
		d, err := pFull.DropExpiredPartitions(ctx, store.RetentionConfig{})
		dropTook += time.Since(start)
		dropped = append(dropped, d...)
		return err
	})
	close(stop)
	<-done
	var droppedRows int64
	for _, p := range dropped {
		droppedRows += p.EstimatedRows
	}
	say("drop-expired (30d): %d partitions, ~%d claims, in %s (%s per partition, detach concurrently + drop), %d restarts survived",
		len(dropped), droppedRows, dropTook.Round(time.Millisecond), (dropTook / time.Duration(max(len(dropped), 1))).Round(time.Millisecond), restarts)
	say("partitioned, during drop:    %s", during)
}
