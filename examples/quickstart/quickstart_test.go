package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/internal/testenv"
	"github.com/claimtx/claimtx/middleware"
)

const (
	beginMarker = "\t// --- quick start (README.md) ---\n"
	endMarker   = "\t// --- end of quick start ---\n"
)

var update = flag.Bool("update", false, "rewrite README.md's quick start from main.go")

// TestReadmeIsQuickstart fails when the README's quick start and this
// program differ: the README's first Go block after "## Quick start" must be
// the region of main.go between the two marker comments, byte for byte,
// with one leading tab removed from each line. After editing main.go,
//
//	go test ./examples/quickstart -run Readme -update
//
// copies the region into README.md.
func TestReadmeIsQuickstart(t *testing.T) {
	src, err := os.ReadFile("main.go")
	require.NoError(t, err)
	want := snippetOf(t, string(src))
	readmePath := filepath.Join("..", "..", "README.md")
	readme, err := os.ReadFile(readmePath)
	require.NoError(t, err)
	got := readmeBlock(t, string(readme))
	if got == want {
		return
	}
	if *update {
		// got is unique enough: the first occurrence is the quick start's.
		updated := strings.Replace(string(readme), "```go\n"+got+"```\n", "```go\n"+want+"```\n", 1)
		require.NoError(t, os.WriteFile(readmePath, []byte(updated), 0o644)) //nolint:gosec // README.md is world-readable
		t.Logf("updated %s", readmePath)
		return
	}
	t.Fatalf("README.md's quick start differs from examples/quickstart/main.go (first difference at line %d);\n"+
		"run go test ./examples/quickstart -run Readme -update, or replace the README's Go block with:\n```go\n%s```",
		firstDiffLine(got, want), want)
}

// snippetOf returns the marked region of src, each line less one tab.
func snippetOf(t *testing.T, src string) string {
	t.Helper()
	_, rest, ok := strings.Cut(src, beginMarker)
	require.True(t, ok, "main.go has no %q", beginMarker)
	region, _, ok := strings.Cut(rest, endMarker)
	require.True(t, ok, "main.go has no %q", endMarker)
	lines := strings.SplitAfter(region, "\n")
	for i, l := range lines {
		lines[i] = strings.TrimPrefix(l, "\t")
	}
	return strings.Join(lines, "")
}

// readmeBlock returns the body of the first ```go block after the
// "## Quick start" heading.
func readmeBlock(t *testing.T, readme string) string {
	t.Helper()
	_, section, ok := strings.Cut(readme, "\n## Quick start\n")
	require.True(t, ok, "README.md has no ## Quick start")
	_, block, ok := strings.Cut(section, "\n```go\n")
	require.True(t, ok, "README.md's quick start has no ```go block")
	block, _, ok = strings.Cut(block, "\n```\n")
	require.True(t, ok, "README.md's quick start block is not closed")
	return block + "\n"
}

func firstDiffLine(a, b string) int {
	al, bl := strings.Split(a, "\n"), strings.Split(b, "\n")
	for i := range min(len(al), len(bl)) {
		if al[i] != bl[i] {
			return i + 1
		}
	}
	return min(len(al), len(bl)) + 1
}

func amqpURL() string {
	if u := os.Getenv("AMQP_URL"); u != "" {
		return u
	}
	return "amqp://guest:guest@127.0.0.1:5672/"
}

func randID() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// TestQuickstartRuns builds the quick start and runs it as a user would,
// on its own database and queue, against the real RabbitMQ and Postgres.
// A plain AMQP producer sends an order, the same order again under a new
// message id, a payload that is not JSON (no key: the claim rejects it) and
// one whose key is fine but whose fields do not decode (the handler's
// framework.Permanent). The order must be credited once, both bad messages
// must land in <topic>.poison with their reasons (not be redelivered
// forever), and SIGTERM must stop the program with status 0.
func TestQuickstartRuns(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "quickstart")
	args := []string{"build", "-o", bin}
	if raceEnabled {
		args = append(args, "-race")
	}
	build := exec.Command("go", append(args, ".")...)
	out, err := build.CombinedOutput()
	require.NoError(t, err, "go build: %s", out)

	dbURL := testenv.NewDatabase(t)
	const schema = "quickstart_claims"
	topic := "quickstart-test-" + randID()
	poisonQ := topic + ".poison"

	conn, err := amqp.Dial(amqpURL())
	require.NoError(t, err)
	t.Cleanup(func() {
		if ch, err := conn.Channel(); err == nil {
			_, _ = ch.QueueDelete(topic, false, false, false)
			_, _ = ch.QueueDelete(poisonQ, false, false, false)
		}
		_ = conn.Close()
	})
	ch, err := conn.Channel()
	require.NoError(t, err)
	// The producer declares the queue as the consumer will (durable, no
	// arguments), so nothing published before the program subscribes is
	// dropped.
	_, err = ch.QueueDeclare(topic, true, false, false, false, nil)
	require.NoError(t, err)

	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(), "BROKER=amqp", "AMQP_URL="+amqpURL(), "TOPIC="+topic,
		"DATABASE_URL="+dbURL, "CLAIMTX_SCHEMA="+schema)
	logs := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = logs, logs
	require.NoError(t, cmd.Start())
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			<-exited
		}
	})

	const order = `{"order_id": 4711, "customer_id": 7, "total_cents": 1250}`
	bad := [][]byte{
		[]byte("not json {"),
		[]byte(`{"order_id": 4712, "customer_id": "seven", "total_cents": 100}`),
	}
	publish(t, ch, topic, []byte(order), []byte(order), bad[0], bad[1])

	pool, err := pgxpool.New(context.Background(), dbURL)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	points := func() int64 {
		var p int64
		if err := pool.QueryRow(context.Background(),
			"SELECT points FROM balances WHERE customer_id = 7").Scan(&p); err != nil {
			return -1
		}
		return p
	}
	require.Eventually(t, func() bool { return points() >= 0 }, 60*time.Second, 20*time.Millisecond,
		"order not applied; program output:\n%s", logs)
	// The bad messages must be poisoned, not handed back to the queue: with
	// no poison route they are nacked and redelivered every second, forever.
	require.Eventually(t, func() bool { return depth(t, conn, poisonQ) >= len(bad) }, 30*time.Second, 20*time.Millisecond,
		"the bad messages did not all reach %s: not poisoned; program output:\n%s", poisonQ, logs)
	// Longer than a nack's requeue delay (AMQP_NACK_DELAY, 1s): a message
	// going round again would show up as a second poisoned copy or stay
	// in the queue below.
	time.Sleep(2 * time.Second)

	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	select {
	case err := <-exited:
		require.NoError(t, err, "exit status after SIGTERM; program output:\n%s", logs)
	case <-time.After(45 * time.Second):
		t.Fatalf("still running 45s after SIGTERM; program output:\n%s", logs)
	}

	// The program is gone, so every delivery it held unacked is back in the
	// queue: an empty queue means all four messages were acked.
	require.Zero(t, depth(t, conn, topic), "messages left in %s (redelivered, never acked)", topic)
	require.Equal(t, len(bad), depth(t, conn, poisonQ), "messages in %s: one copy per bad message", poisonQ)
	require.Equal(t, int64(12), points(), "points of customer 7: 1250 cents credited once")
	var claims int
	require.NoError(t, pool.QueryRow(context.Background(),
		"SELECT count(*) FROM "+schema+".processed_messages").Scan(&claims))
	require.Equal(t, 1, claims, "claims recorded")

	var poisoned [][]byte
	for range bad {
		d, ok, err := ch.Get(poisonQ, true)
		require.NoError(t, err)
		require.True(t, ok, "poisoned message")
		reason, _ := d.Headers[middleware.PoisonReasonKey].(string)
		require.NotEmpty(t, reason, "%s header; headers: %v", middleware.PoisonReasonKey, d.Headers)
		t.Logf("%s poisoned: %s", d.Body, reason)
		poisoned = append(poisoned, d.Body)
	}
	require.ElementsMatch(t, bad, poisoned, "the poisoned messages are the bad payloads")
}

// publish sends payloads as a plain producer would: default exchange,
// routing key = topic, persistent, a fresh message id each, confirmed.
func publish(t *testing.T, ch *amqp.Channel, topic string, payloads ...[]byte) {
	t.Helper()
	require.NoError(t, ch.Confirm(false))
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation, len(payloads)))
	for _, p := range payloads {
		require.NoError(t, ch.PublishWithContext(context.Background(), "", topic, false, false, amqp.Publishing{
			DeliveryMode: amqp.Persistent, MessageId: randID(), ContentType: "application/json", Body: p,
		}))
	}
	for range payloads {
		select {
		case c := <-confirms:
			require.True(t, c.Ack, "publish not confirmed")
		case <-time.After(30 * time.Second):
			t.Fatal("no publisher confirm within 30s")
		}
	}
}

// depth returns the ready messages of queue, 0 when it does not exist yet.
// Unacked deliveries are not counted.
func depth(t *testing.T, conn *amqp.Connection, queue string) int {
	t.Helper()
	ch, err := conn.Channel()
	require.NoError(t, err)
	q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	var aerr *amqp.Error
	if errors.As(err, &aerr) && aerr.Code == amqp.NotFound {
		return 0 // the failed declaration closed the channel
	}
	require.NoError(t, err)
	_ = ch.Close()
	return q.Messages
}

// syncBuffer collects a subprocess's output while it runs.
type syncBuffer = testenv.Output
