package claimtxcli

import (
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
	file := filepath.Join(t.TempDir(), "loyalty.yaml")
	require.NoError(t, os.WriteFile(file, fmt.Appendf(nil, `name: loyalty
topic: %s
key: %q
database_url: %q
store: {schema: %s}
broker:
  kind: amqp
  amqp: {url: %q}
`, w.Topic, dlqKeySpec, testenv.URL(), w.Schema, dlqtest.AMQPURL), 0o600))

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	out := &testenv.Output{}
	done := make(chan int, 1)
	go func() {
		done <- runEnv(ctx, []string{"console", "--listen", "127.0.0.1:0", "--consumer-config", file, "--replay-rate", "50"},
			out, out, func(string) string { return "" })
	}()
	addr := regexp.MustCompile(`console listening on (http://[0-9.:]+) `)
	var base string
	require.Eventually(t, func() bool {
		m := addr.FindStringSubmatch(out.String())
		if m != nil {
			base = m[1]
		}
		return m != nil
	}, 30*time.Second, 20*time.Millisecond, "output: %s", out)

	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	get := func(path string) string {
		resp, err := client.Get(base + path)
		require.NoError(t, err)
		defer func() { _ = resp.Body.Close() }()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return string(b)
	}
	csrf := regexp.MustCompile(`name="csrf" value="([^"]+)"`).FindStringSubmatch(get("/dead-letters"))
	require.NotNil(t, csrf)
	resp, err := client.PostForm(base+"/dead-letters/replay", url.Values{"csrf": {csrf[1]}, "consumer": {"loyalty"}, "scope": {"all"}})
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
	case code := <-done:
		require.Equal(t, exitOK, code, out.String())
	case <-time.After(60 * time.Second):
		t.Fatal("the console did not stop")
	}
	require.Contains(t, out.String(), "console stopped")

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
