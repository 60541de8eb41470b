//go:build browser

package console_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/internal/testenv"
)

// The browser test runs the console the way an operator does and clicks
// through it in Debian's Chromium, driven by Playwright
// (e2e/console.test.mjs, `node --test`): real processes (the loyalty
// consumer, `claimtx migrate`, `claimtx console`), real RabbitMQ queues, an
// own Postgres schema. make test-browser runs it (after e2e/install.sh has
// installed Chromium and playwright-core); make console-screenshots runs
// it with SCREENSHOT_DIR=docs/images.
//
// The dead letters are poisoned by the real consumer, not forged: a first
// consumer runs with the loyalty example's fault injection (a handler that
// holds its transaction for an hour, cut off by HANDLER_TIMEOUT), so the
// orders it receives are dead-lettered with the consumer's own stamps and
// never applied; a second, healthy consumer then applies the other orders,
// and re-applies two of the poisoned ones (one with a changed payload), so
// the poison queue holds every class: would apply, already applied, already
// applied with a DIFFERENT payload, still bad.

const (
	amqpURL      = "amqp://guest:guest@127.0.0.1:5672/"
	consumerName = "loyalty"
	keyPrefix    = "order-completed:"
	// replayOpen and replayToken are the would-apply orders replayed from
	// the browser, one per run (without and with a token).
	replayOpen  = 9001
	replayToken = 9002
	// reapplied is poisoned, then delivered again unchanged and applied;
	// changed is poisoned, then applied with another total.
	reapplied = 9003
	changed   = 9004
	// lookupOrder is applied normally; missingOrder never exists.
	lookupOrder  = 7
	missingOrder = 424242
	// hostileID is an order id a producer could send: the key the console
	// derives from it must be shown as text, never as markup.
	hostileID = `<img src=x onerror=alert(1)>`
)

type order struct {
	OrderID    any   `json:"order_id,omitempty"`
	CustomerID int64 `json:"customer_id"`
	TotalCents int64 `json:"total_cents"`
}

// letter is what the browser must see in the Dead letters table.
type letter struct {
	Key   string `json:"key"`   // today's key; "" for a still-bad letter
	Class string `json:"class"` // dlq.Class, the row's data-class
	Text  string `json:"text"`  // the class cell's text
}

func TestBrowser(t *testing.T) {
	t.Parallel()
	start := time.Now()
	root := repoRoot(t)
	e2eDir := filepath.Join(root, "framework", "cmd", "claimtx", "internal", "console", "e2e")
	node := testenv.RequireTool(t, "node")
	chromium := os.Getenv("CHROMIUM_PATH")
	if chromium == "" {
		chromium = "/usr/bin/chromium"
	}
	if _, err := os.Stat(chromium); err != nil {
		testenv.SkipOrFail(t, "Chromium not found at %s (set CHROMIUM_PATH, or run bash framework/cmd/claimtx/internal/console/e2e/install.sh): %v", chromium, err)
	}
	if _, err := os.Stat(filepath.Join(e2eDir, "node_modules", "playwright-core")); err != nil {
		testenv.SkipOrFail(t, "playwright-core is not installed: run bash framework/cmd/claimtx/internal/console/e2e/install.sh (%v)", err)
	}
	shots := os.Getenv("SCREENSHOT_DIR")
	if shots == "" {
		shots = t.TempDir()
	} else {
		abs, err := filepath.Abs(shots)
		require.NoError(t, err)
		shots = abs
		require.NoError(t, os.MkdirAll(shots, 0o755))
	}

	bin := t.TempDir()
	loyaltyBin, claimtxBin := filepath.Join(bin, "loyalty"), filepath.Join(bin, "claimtx")
	goBuild(t, root, loyaltyBin, "./examples/loyalty")
	goBuild(t, root, claimtxBin, "./framework/cmd/claimtx")
	t.Logf("built loyalty and claimtx in %s", time.Since(start).Round(time.Millisecond))

	w := newWorld(t)
	run(t, claimtxBin, nil, "migrate", "--database-url", w.dbURL, "--schema", w.schema)
	w.seedOtherConsumer(t)
	w.seedParked(t)

	// Phase 1: every order this consumer receives is dead-lettered with the
	// consumer's own stamps: its handler holds the claim transaction open
	// for an hour and HANDLER_TIMEOUT cuts it off (twice: one retry).
	poisoned := []order{
		{OrderID: replayOpen, CustomerID: 41, TotalCents: 4100},
		{OrderID: replayToken, CustomerID: 42, TotalCents: 4200},
		{OrderID: reapplied, CustomerID: 43, TotalCents: 4300},
		{OrderID: changed, CustomerID: 44, TotalCents: 4400},
		{OrderID: hostileID, CustomerID: 45, TotalCents: 4500}, // keyed, but not an order the handler takes
		{CustomerID: 46, TotalCents: 4600},                     // no order_id: today's key spec cannot key it
	}
	p1 := w.startLoyalty(t, loyaltyBin, "LOYALTY_HANDLER_DELAY=1h", "HANDLER_TIMEOUT=300ms", "METRICS_ADDR=127.0.0.1:0")
	w.publish(t, poisoned...)
	w.await(t, "6 orders dead-lettered by the faulty consumer", func() bool {
		return w.queueDepth(w.poison) == len(poisoned) && p1.outcomes()["poisoned"] == len(poisoned)
	})
	p1.stop(t)
	t.Logf("seeded %d dead letters in %s", len(poisoned), time.Since(start).Round(time.Millisecond))

	// Phase 2: a healthy consumer applies orders 1-12 (1-3 twice: three
	// duplicates), the unchanged copy of one poisoned order and a changed
	// copy of another.
	p2 := w.startLoyalty(t, loyaltyBin, "METRICS_ADDR=127.0.0.1:0")
	var applied []order
	for id := int64(1); id <= 12; id++ {
		applied = append(applied, order{OrderID: id, CustomerID: 1 + id%4, TotalCents: 1000 + 100*id})
	}
	w.publish(t, applied...)
	w.publish(t, poisoned[2], order{OrderID: changed, CustomerID: 44, TotalCents: 9900})
	w.await(t, "14 claims", func() bool { return w.claims(consumerName) == len(applied)+2 })
	// Redeliveries of committed orders: duplicates, for the overview's
	// metrics column.
	w.publish(t, applied[:3]...)
	w.await(t, "14 claims and 3 duplicates", func() bool {
		return w.claims(consumerName) == len(applied)+2 && p2.outcomes()["duplicate"] == 3
	})
	t.Logf("seeded %d applied orders in %s", len(applied)+2, time.Since(start).Round(time.Millisecond))
	metrics := p2.metricsURL()
	require.NotEmpty(t, metrics, "the consumer's metrics address")

	letters := []letter{
		{Key: key(replayOpen), Class: "would-apply", Text: "would apply"},
		{Key: key(replayToken), Class: "would-apply", Text: "would apply"},
		{Key: key(reapplied), Class: "already-applied", Text: "already applied"},
		{Key: key(changed), Class: "already-applied", Text: "already applied (DIFFERENT payload)"},
		{Key: keyPrefix + hostileID, Class: "would-apply", Text: "would apply"},
		{Key: "", Class: "still-bad", Text: "still bad"},
	}

	// Without a token: loopback only, no sign-in.
	ok := t.Run("open", func(t *testing.T) {
		c := startConsole(t, claimtxBin, w, nil, "--metrics", consumerName+"="+metrics)
		browse(t, node, e2eDir, c, scenario{
			replay: replayOpen, letters: letters, shots: shots,
		})
		c.stop(t)
		w.assertReplayed(t, replayOpen, len(poisoned)-1)
		var due bool
		require.NoError(t, w.pool.QueryRow(context.Background(), fmt.Sprintf(`SELECT retry_at IS NOT NULL FROM %q.processed_messages_parked_keys`, w.schema)).Scan(&due))
		require.True(t, due, "the browser's Retry requested a release")
	})
	if !ok {
		return
	}

	// With a token: the browser signs in through the login page, and the
	// replay's forms carry the signed-in session's CSRF token.
	t.Run("token", func(t *testing.T) {
		token := randHex(24)
		c := startConsole(t, claimtxBin, w, []string{"CLAIMTX_CONSOLE_TOKEN=" + token})
		browse(t, node, e2eDir, c, scenario{
			token: token, replay: replayToken, letters: letters[1:], shots: t.TempDir(),
		})
		c.stop(t)
		w.assertReplayed(t, replayToken, len(poisoned)-2)
	})
	t.Logf("TestBrowser: %s in all", time.Since(start).Round(time.Millisecond))
}

func key(orderID int64) string { return keyPrefix + strconv.FormatInt(orderID, 10) }

// scenario is what one run of console.test.mjs checks.
type scenario struct {
	token   string   // sign in with it; "" when the console has none
	replay  int64    // the would-apply order to replay
	letters []letter // the letters the Dead letters page must show
	shots   string   // SCREENSHOT_DIR
}

// browse runs the browser scenario against the console c and logs its
// report (the spec reporter's lines: each step and its duration).
func browse(t *testing.T, node, dir string, c *proc, s scenario) {
	t.Helper()
	expect, err := json.Marshal(s.letters)
	require.NoError(t, err)
	// Kept after the test (not a t.TempDir): the pages of a failed run are
	// what tells why.
	failures := filepath.Join(os.TempDir(), "claimtx-console-e2e-"+randHex(4))
	env := []string{
		"CONSOLE_URL=" + c.url,
		"CONSOLE_CONSUMER=" + consumerName,
		"CONSOLE_TOKEN=" + s.token,
		"LOOKUP_KEY=" + key(lookupOrder),
		"MISSING_KEY=" + key(missingOrder),
		"REPLAY_KEY=" + key(s.replay),
		"PARKED_KEY=" + parkedKey,
		"EXPECT_LETTERS=" + string(expect),
		"SCREENSHOT_DIR=" + s.shots,
		"FAILURE_DIR=" + failures,
	}
	if p := os.Getenv("CHROMIUM_PATH"); p != "" {
		env = append(env, "CHROMIUM_PATH="+p)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "--test", "--test-reporter=spec", "console.test.mjs")
	cmd.Dir = dir
	cmd.Env = baseEnv(env...)
	// Chromium is the runner's child: a cancelled run ends the whole group.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	began := time.Now()
	err = cmd.Run()
	t.Logf("browser scenario (%s), %s:\n%s", c.url, time.Since(began).Round(time.Millisecond), out.String())
	if err != nil {
		t.Logf("console output:\n%s", c.out.String())
	}
	require.NoError(t, err, "node --test console.test.mjs; the page of the failed step is in %s", failures)
}

// world is the test's own corner of the shared servers: a schema, a queue
// and its poison queue, and the consumer configuration file the loyalty
// consumer and the console both read.
type world struct {
	schema, dbURL string
	pool          *pgxpool.Pool
	topic, poison string
	config        string
	conn          *amqp.Connection
}

func newWorld(t *testing.T) *world {
	t.Helper()
	pool, schema := testenv.Setup(t, 4)
	dbURL, err := testenv.URLWithSearchPath(schema)
	require.NoError(t, err)
	w := &world{schema: schema, dbURL: dbURL, pool: pool, topic: "console-e2e-" + randHex(4)}
	w.poison = w.topic + ".poison"

	conn, err := amqp.Dial(amqpURL)
	require.NoError(t, err)
	w.conn = conn
	t.Cleanup(func() { _ = conn.Close() })
	t.Cleanup(func() { deleteQueues(t, w.topic, w.poison) })
	// Declared before any consumer runs, so what is published while none
	// does is kept; the consumers declare it alike.
	ch, err := conn.Channel()
	require.NoError(t, err)
	_, err = ch.QueueDeclare(w.topic, true, false, false, false, nil)
	require.NoError(t, err)
	require.NoError(t, ch.Close())

	// The examples/loyalty/config.example.yaml format. Fingerprints let the
	// console tell an already applied letter whose payload differs.
	w.config = filepath.Join(t.TempDir(), "loyalty.yaml")
	require.NoError(t, os.WriteFile(w.config, fmt.Appendf(nil, `# The loyalty consumer of TestBrowser; the console reads it too.
name: %s
topic: %s
key: "template:%s{payload.order_id}"
database_url: %q
store:
  schema: %s
claim:
  fingerprint: true
handler:
  retries: 1
  retry_initial_interval: 50ms
drain_timeout: 5s
startup_timeout: 30s
broker:
  kind: amqp
  amqp:
    url: %q
    concurrency: 4
    nack_delay: 100ms
`, consumerName, w.topic, keyPrefix, dbURL, schema, amqpURL), 0o600))
	return w
}

// seedOtherConsumer gives the overview a second consumer, known only from
// the claim table (no configuration file), with claims spread over the
// last 24 hours for its chart.
func (w *world) seedOtherConsumer(t *testing.T) {
	t.Helper()
	_, err := w.pool.Exec(context.Background(), fmt.Sprintf(`INSERT INTO %q.processed_messages (consumer, message_key, processed_at)
		SELECT 'billing', 'invoice:' || g, now() - g * interval '1 minute' * (1 + (g %% 7))
		FROM generate_series(1, 240) AS g`, w.schema))
	require.NoError(t, err)
}

// parkedKey is the order key seedParked parks for the consumer.
const parkedKey = "customer-77"

// seedParked parks parkedKey: a head that failed and one message behind it.
func (w *world) seedParked(t *testing.T) {
	t.Helper()
	for _, sql := range []string{
		`INSERT INTO %q.processed_messages_parked_keys (consumer, order_key, reason) VALUES ($1, $2, 'total_cents is not a number')`,
		`INSERT INTO %q.processed_messages_parked (consumer, order_key, message_key, uuid, payload, reason) VALUES
	($1, $2, 'order-completed:7701', 'p-1', '{"order_id": 7701}', 'total_cents is not a number'),
	($1, $2, 'order-completed:7702', 'p-2', '{"order_id": 7702}', NULL)`,
	} {
		_, err := w.pool.Exec(context.Background(), fmt.Sprintf(sql, w.schema), consumerName, parkedKey)
		require.NoError(t, err)
	}
}

func (w *world) startLoyalty(t *testing.T, bin string, extra ...string) *proc {
	t.Helper()
	p := startProc(t, "loyalty", bin, nil, baseEnv(append([]string{"CONFIG_FILE=" + w.config}, extra...)...))
	p.waitLog(t, `msg="loyalty: consuming"`)
	return p
}

// publish sends orders as a plain producer does: default exchange, routing
// key = queue, an event_id header, publisher confirms.
func (w *world) publish(t *testing.T, orders ...order) {
	t.Helper()
	ch, err := w.conn.Channel()
	require.NoError(t, err)
	defer func() { _ = ch.Close() }()
	require.NoError(t, ch.Confirm(false))
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation, len(orders)))
	for _, o := range orders {
		body, err := json.Marshal(o)
		require.NoError(t, err)
		require.NoError(t, ch.PublishWithContext(context.Background(), "", w.topic, false, false, amqp.Publishing{
			DeliveryMode: amqp.Persistent, MessageId: randHex(8), Body: body,
			Headers: amqp.Table{"event_id": fmt.Sprintf("evt-%v", o.OrderID)},
		}))
	}
	for range orders {
		select {
		case c := <-confirms:
			require.True(t, c.Ack, "RabbitMQ confirmed the order")
		case <-time.After(30 * time.Second):
			require.FailNow(t, "no publisher confirm within 30s")
		}
	}
}

// The probes below are polled by require.Eventually, whose condition runs
// on a goroutine of its own where a test must not fail: they answer -1
// (never what is awaited) when they cannot tell.

// queueDepth is the ready messages of queue; 0 when it does not exist yet
// (the consumer declares the poison queue on its first poison).
func (w *world) queueDepth(queue string) int {
	ch, err := w.conn.Channel()
	if err != nil {
		return -1
	}
	defer func() { _ = ch.Close() }()
	q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	var aerr *amqp.Error
	switch {
	case errors.As(err, &aerr) && aerr.Code == amqp.NotFound:
		return 0
	case err != nil:
		return -1
	}
	return q.Messages
}

func (w *world) claims(consumer string) int {
	var n int
	err := w.pool.QueryRow(context.Background(), fmt.Sprintf(`SELECT count(*) FROM %q.processed_messages WHERE consumer = $1`, w.schema), consumer).Scan(&n)
	if err != nil {
		return -1
	}
	return n
}

func (w *world) count(t *testing.T, sql string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, w.pool.QueryRow(context.Background(), sql, args...).Scan(&n))
	return n
}

func (w *world) await(t *testing.T, what string, cond func() bool) {
	t.Helper()
	require.Eventually(t, cond, 60*time.Second, 25*time.Millisecond, what)
}

// assertReplayed checks, from Postgres and RabbitMQ rather than from what
// the browser saw, that the order replayed from the console was applied
// exactly once and is no longer a dead letter, and that left letters
// remain.
func (w *world) assertReplayed(t *testing.T, orderID int64, left int) {
	t.Helper()
	// The consumer has taken everything the replay republished.
	w.await(t, "the loyalty queue drained", func() bool { return w.queueDepth(w.topic) == 0 })
	require.Equal(t, 1, w.count(t, `SELECT count(*) FROM point_ledger WHERE order_id = $1`, orderID), "ledger rows of order %d", orderID)
	require.Equal(t, 1, w.count(t, fmt.Sprintf(`SELECT count(*) FROM %q.processed_messages WHERE consumer = $1 AND message_key = $2`, w.schema),
		consumerName, key(orderID)), "claim of order %d", orderID)

	// Browse the poison queue without consuming it: every message taken
	// unacked on a channel of our own, which RabbitMQ requeues in place
	// when the channel closes.
	ch, err := w.conn.Channel()
	require.NoError(t, err)
	defer func() { _ = ch.Close() }()
	q, err := ch.QueueDeclarePassive(w.poison, true, false, false, false, nil)
	require.NoError(t, err)
	require.Equal(t, left, q.Messages, "letters left in %s", w.poison)
	for i := 0; i < q.Messages; i++ {
		d, ok, err := ch.Get(w.poison, false)
		require.NoError(t, err)
		require.True(t, ok, "poison queue ran dry after %d of %d", i, q.Messages)
		var o order
		_ = json.Unmarshal(d.Body, &o) // still-bad letters need not decode
		require.NotEqual(t, fmt.Sprint(orderID), fmt.Sprint(o.OrderID), "order %d is still in %s", orderID, w.poison)
	}
}

// startConsole runs `claimtx console` on a free loopback port with the
// consumer's configuration file, and waits for /healthz. A port free when
// picked may be taken by another test before the console binds it: then
// the console exits at once, and another port is tried.
func startConsole(t *testing.T, bin string, w *world, env []string, args ...string) *proc {
	t.Helper()
	client := &http.Client{Timeout: time.Second}
	for attempt := 1; ; attempt++ {
		addr := freeAddr(t)
		argv := append([]string{"console", "--listen", addr, "--consumer-config", w.config}, args...)
		p := startProc(t, "console", bin, argv, baseEnv(env...))
		p.url = "http://" + addr
		require.Eventually(t, func() bool {
			if !p.running() {
				return true // told apart below
			}
			resp, err := client.Get(p.url + "/healthz")
			if err != nil {
				return false
			}
			_ = resp.Body.Close()
			return resp.StatusCode == http.StatusOK
		}, 30*time.Second, 25*time.Millisecond, "console never answered /healthz:\n%s", p.out.String())
		if p.running() {
			return p
		}
		if attempt < 3 && strings.Contains(p.out.String(), "address already in use") {
			continue
		}
		require.FailNow(t, "console exited at start", "%v\n%s", p.err, p.out.String())
	}
}

// proc is a process of the test, stopped with SIGTERM (then SIGKILL) and
// awaited when the test ends.
type proc struct {
	name string
	cmd  *exec.Cmd
	out  *testenv.Output
	done chan struct{}
	err  error
	url  string // the console's
}

func startProc(t *testing.T, name, bin string, args, env []string) *proc {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = env
	p := &proc{name: name, cmd: cmd, out: &testenv.Output{}, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = p.out, p.out
	require.NoError(t, cmd.Start())
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.terminate()
		if t.Failed() {
			t.Logf("%s (pid %d) output:\n%s", name, cmd.Process.Pid, p.out.String())
		}
	})
	return p
}

func (p *proc) running() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

func (p *proc) terminate() {
	if !p.running() {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(20 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// stop ends the process with SIGTERM and requires a clean exit.
func (p *proc) stop(t *testing.T) {
	t.Helper()
	p.terminate()
	require.NoError(t, p.err, "%s exit after SIGTERM; output:\n%s", p.name, p.out.String())
}

func (p *proc) waitLog(t *testing.T, substr string) {
	t.Helper()
	require.Eventually(t, func() bool { return strings.Contains(p.out.String(), substr) || !p.running() },
		60*time.Second, 25*time.Millisecond, "%s never logged %q:\n%s", p.name, substr, p.out.String())
	require.True(t, p.running(), "%s exited: %v\n%s", p.name, p.err, p.out.String())
}

var metricsAddrRE = regexp.MustCompile(`msg="loyalty: serving /metrics and /healthz" addr=(\S+)`)

// metricsURL is the loyalty consumer's /metrics, read from its log (it
// binds 127.0.0.1:0, and logs the address before it says it consumes).
func (p *proc) metricsURL() string {
	if m := metricsAddrRE.FindStringSubmatch(p.out.String()); m != nil {
		return "http://" + m[1] + "/metrics"
	}
	return ""
}

var outcomeRE = regexp.MustCompile(`^claimtx_messages_total\{.*outcome="([a-z_]+)".*\} (\S+)$`)

// outcomes scrapes claimtx_messages_total by outcome; nil when it cannot.
func (p *proc) outcomes() map[string]int {
	url := p.metricsURL()
	if url == "" {
		return nil
	}
	resp, err := http.Get(url)
	if err != nil {
		return nil
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil
	}
	out := map[string]int{}
	for _, line := range strings.Split(string(body), "\n") {
		if m := outcomeRE.FindStringSubmatch(line); m != nil {
			v, err := strconv.ParseFloat(m[2], 64)
			if err != nil {
				return nil
			}
			out[m[1]] += int(v)
		}
	}
	return out
}

// baseEnv is the environment of the processes the test starts: only what a
// program needs to run, plus extra. The consumer configuration is read
// from the environment too (consumer.LoadConfig), so nothing of the
// test's own environment may leak into it: the file alone configures both
// the consumer and the console.
func baseEnv(extra ...string) []string {
	var env []string
	for _, name := range []string{"PATH", "HOME", "TMPDIR", "LANG", "USER"} {
		if v, ok := os.LookupEnv(name); ok {
			env = append(env, name+"="+v)
		}
	}
	return append(env, extra...)
}

func goBuild(t *testing.T, root, out, pkg string) {
	t.Helper()
	cmd := exec.Command("go", "build", "-o", out, pkg)
	cmd.Dir = root
	b, err := cmd.CombinedOutput()
	require.NoError(t, err, "go build %s:\n%s", pkg, b)
}

func run(t *testing.T, bin string, env []string, args ...string) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = baseEnv(env...)
	b, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s %s:\n%s", filepath.Base(bin), strings.Join(args, " "), b)
}

// repoRoot is the module's root: go test runs in the package directory,
// five levels below it (framework/cmd/claimtx/internal/console).
func repoRoot(t *testing.T) string {
	t.Helper()
	wd, err := os.Getwd()
	require.NoError(t, err)
	for range 5 {
		wd = filepath.Dir(wd)
	}
	return wd
}

// freeAddr returns a loopback address with a port free a moment ago.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	return addr
}

func deleteQueues(t *testing.T, queues ...string) {
	conn, err := amqp.Dial(amqpURL)
	if err != nil {
		t.Logf("cannot delete queues %v: %v", queues, err)
		return
	}
	defer func() { _ = conn.Close() }()
	for _, q := range queues {
		ch, err := conn.Channel()
		if err != nil {
			return
		}
		_, _ = ch.QueueDelete(q, false, false, false)
		_ = ch.Close()
	}
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
