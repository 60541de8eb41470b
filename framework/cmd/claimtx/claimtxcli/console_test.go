package claimtxcli

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/brokers"
	"github.com/claimtx/claimtx/framework/cmd/claimtx/internal/dlq/dlqtest"
	"github.com/claimtx/claimtx/internal/testenv"
)

// A console other hosts could reach needs a token: without one the
// command refuses to start (exit 2) and names the fix, before touching
// the database; a short token is refused too.
func TestCLIConsoleRefusesNonLoopbackWithoutToken(t *testing.T) {
	t.Parallel()
	c := &cli{t: t, schema: "unused", env: map[string]string{"DATABASE_URL": "postgres://nobody@127.0.0.1:1/none"}}
	for _, listen := range []string{":7070", "0.0.0.0:7070", "[::]:7070", "192.168.1.10:7070", "console.example.com:7070"} {
		code, _, errOut := c.run("console", "--listen", listen)
		require.Equal(t, exitUsage, code, listen)
		require.Contains(t, errOut, "refusing to listen on "+listen+" without an access token", listen)
		require.Contains(t, errOut, "CLAIMTX_CONSOLE_TOKEN", listen)
		require.Contains(t, errOut, "--token-file", listen)
	}
	c.env["CLAIMTX_CONSOLE_LISTEN"] = "0.0.0.0:7070"
	code, _, errOut := c.run("console")
	require.Equal(t, exitUsage, code)
	require.Contains(t, errOut, "refusing to listen on 0.0.0.0:7070")

	c.env["CLAIMTX_CONSOLE_TOKEN"] = "too-short"
	code, _, errOut = c.run("console")
	require.Equal(t, exitUsage, code)
	require.Contains(t, errOut, "at least 16")
	delete(c.env, "CLAIMTX_CONSOLE_TOKEN")

	file := filepath.Join(t.TempDir(), "token")
	require.NoError(t, os.WriteFile(file, []byte("short\n"), 0o600))
	code, _, errOut = c.run("console", "--token-file", file)
	require.Equal(t, exitUsage, code)
	require.Contains(t, errOut, "at least 16")

	code, _, errOut = c.run("console", "--listen", "localhost")
	require.Equal(t, exitUsage, code)
	require.Contains(t, errOut, "want HOST:PORT")

	code, _, errOut = c.run("console", "--listen", "127.0.0.1:0", "--metrics", "loyalty")
	require.Equal(t, exitUsage, code)
	require.Contains(t, errOut, "want NAME=URL")

	require.Contains(t, c.ok("console", "-h"), "--token-file")
	require.Contains(t, c.ok("help"), "claimtx console")
}

// SIGTERM (the command's context ending) while a replay job runs: the
// server stops, the job is cancelled between two batches, and nothing is
// lost: every letter is on the topic, still in the poison queue, or both.
func TestCLIConsoleShutdownDuringReplay(t *testing.T) {
	t.Parallel()
	w := dlqtest.New(t, brokers.KindAMQP, 1)
	orders := dlqtest.Orders(1, 300)
	w.Publish(w.Poison, w.Poisoned("loyalty", dlqKeySpec, errors.New("boom"), orders...)...)
	file := consumerConfig(t, w, "loyalty", dlqKeySpec, "")

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	con := startConsole(ctx, t, Config{}, "--consumer-config", file, "--replay-rate", "50")
	get := con.get
	csrf := regexp.MustCompile(`name="csrf" value="([^"]+)"`).FindStringSubmatch(get("/dead-letters"))
	require.NotNil(t, csrf)
	resp, err := con.client.PostForm(con.base+"/dead-letters/replay", url.Values{"csrf": {csrf[1]}, "consumer": {"loyalty"}, "scope": {"all"}})
	require.NoError(t, err)
	_ = resp.Body.Close()
	require.Equal(t, http.StatusSeeOther, resp.StatusCode)
	job := resp.Header.Get("Location")
	// At 50 letters a second in batches of 100, the job waits about 2 s
	// after each batch: stop it in the first wait.
	replayed := regexp.MustCompile(`letters read, (\d+) replayed`)
	require.Eventually(t, func() bool {
		body := get(job)
		m := replayed.FindStringSubmatch(body)
		return strings.Contains(body, ">running</p>") && m != nil && m[1] != "0"
	}, 30*time.Second, 20*time.Millisecond)
	cancel()
	select {
	case code := <-con.done:
		require.Equal(t, exitOK, code, con.out.String())
	case <-time.After(60 * time.Second):
		t.Fatal("the console did not stop")
	}
	require.Contains(t, con.out.String(), "console stopped")

	onTopic := w.Read(w.Topic)
	require.NotEmpty(t, onTopic)
	require.Less(t, len(onTopic), 300, "interrupted before the end")
	seen := map[string]bool{}
	for _, m := range append(onTopic, w.Read(w.Poison)...) {
		seen[m.UUID] = true
	}
	for _, o := range orders {
		require.True(t, seen[o.UUID], "%s lost", o.UUID)
	}
}

// runningConsole is `claimtx console` serving on a free loopback port.
type runningConsole struct {
	t      *testing.T
	base   string // http://127.0.0.1:PORT
	client *http.Client
	out    *testenv.Output
	done   chan int // the exit status, once ctx ends
}

// startConsole runs `claimtx console --listen 127.0.0.1:0 args…` with cfg
// and an empty environment until ctx ends, and waits until it listens.
func startConsole(ctx context.Context, t *testing.T, cfg Config, args ...string) *runningConsole {
	t.Helper()
	con := &runningConsole{t: t, out: &testenv.Output{}, done: make(chan int, 1),
		client: &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
	go func() {
		con.done <- runEnv(ctx, cfg, append([]string{"console", "--listen", "127.0.0.1:0"}, args...),
			con.out, con.out, func(string) string { return "" })
	}()
	addr := regexp.MustCompile(`console listening on (http://[0-9.:]+) `)
	require.Eventually(t, func() bool {
		m := addr.FindStringSubmatch(con.out.String())
		if m != nil {
			con.base = m[1]
		}
		return m != nil
	}, 30*time.Second, 20*time.Millisecond, "output: %s", con.out)
	return con
}

// get returns the body of the page at path.
func (con *runningConsole) get(path string) string {
	con.t.Helper()
	_, body := con.do(http.MethodGet, path, nil)
	return body
}

// post posts form to path and returns the status and body of the answer.
func (con *runningConsole) post(path string, form url.Values) (int, string) {
	con.t.Helper()
	return con.do(http.MethodPost, path, form)
}

// do sends a request with form (if any) to path and returns the status
// and body of the answer.
func (con *runningConsole) do(method, path string, form url.Values) (int, string) {
	con.t.Helper()
	req, err := http.NewRequest(method, con.base+path, strings.NewReader(form.Encode()))
	require.NoError(con.t, err)
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	resp, err := con.client.Do(req)
	require.NoError(con.t, err)
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	require.NoError(con.t, err)
	return resp.StatusCode, string(b)
}

// consumerConfig writes the configuration file of consumer, keyed with
// keySpec, on w's topic and schema, and returns its path. Its broker
// section is broker, or w's RabbitMQ when that is empty.
func consumerConfig(t *testing.T, w *dlqtest.World, consumer, keySpec, broker string) string {
	t.Helper()
	broker = cmp.Or(broker, fmt.Sprintf("{kind: amqp, amqp: {url: %q}}", dlqtest.AMQPURL))
	file := filepath.Join(t.TempDir(), consumer+".yaml")
	require.NoError(t, os.WriteFile(file, fmt.Appendf(nil, `name: %s
topic: %s
key: %q
database_url: %q
store: {schema: %s}
broker: %s
`, consumer, w.Topic, keySpec, testenv.URL(), w.Schema, broker), 0o600))
	return file
}
