package main

import (
	"bufio"
	"context"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"
)

// The test binary doubles as devkafka: with DEVKAFKA_RUN_MAIN=1 it runs
// main, so the signal test needs no separate build.
func TestMain(m *testing.M) {
	if os.Getenv("DEVKAFKA_RUN_MAIN") == "1" {
		main()
		return
	}
	os.Exit(m.Run())
}

func TestDefaultAddr(t *testing.T) {
	t.Parallel()
	env := func(v string) func(string) string { return func(string) string { return v } }
	require.Equal(t, "127.0.0.1:9092", defaultAddr(env("")))
	require.Equal(t, "kafka:19092", defaultAddr(env(" kafka:19092 , other:1")))
	require.Equal(t, "127.0.0.1:9092", defaultAddr(env(" , ")))
}

func TestFlags(t *testing.T) {
	t.Parallel()
	var out, errOut strings.Builder
	noenv := func(string) string { return "" }
	require.Equal(t, 2, run(t.Context(), []string{"-log-level", "loud"}, noenv, &out, &errOut))
	require.Equal(t, 2, run(t.Context(), []string{"extra"}, noenv, &out, &errOut))
	require.Equal(t, 1, run(t.Context(), []string{"-addr", "0.0.0.0:9092"}, noenv, &out, &errOut))
	require.Equal(t, 0, run(t.Context(), []string{"-h"}, noenv, &out, &errOut))
	require.Empty(t, out.String(), "nothing on stdout unless listening")
}

// TestRun starts the broker in process, produces and consumes through it,
// and stops it by cancelling the context (what SIGTERM does in main).
func TestRun(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	stdoutR, stdoutW := io.Pipe()
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"-addr", "127.0.0.1:0", "-log-level", "warn"}, func(string) string { return "" }, stdoutW, io.Discard)
		_ = stdoutW.Close()
	}()
	line, err := bufio.NewReader(stdoutR).ReadString('\n')
	require.NoError(t, err)
	addr := strings.TrimSpace(strings.TrimPrefix(line, "devkafka listening on "))
	require.NotEqual(t, line, addr, "ready line: %q", line)

	cl, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.AllowAutoTopicCreation(),
		kgo.ConsumeTopics("hello"), kgo.FetchMaxWait(100*time.Millisecond))
	require.NoError(t, err)
	defer cl.Close()
	require.NoError(t, cl.ProduceSync(ctx, &kgo.Record{Topic: "hello", Value: []byte("world")}).FirstErr())
	pollCtx, pollCancel := context.WithTimeout(ctx, 10*time.Second)
	defer pollCancel()
	fetches := cl.PollFetches(pollCtx)
	require.NoError(t, fetches.Err())
	require.Equal(t, "world", string(fetches.Records()[0].Value))

	cancel()
	select {
	case code := <-done:
		require.Equal(t, 0, code)
	case <-time.After(10 * time.Second):
		t.Fatal("run did not return after cancel")
	}
}

// TestSignal runs the real main as a process and stops it with SIGTERM.
func TestSignal(t *testing.T) {
	t.Parallel()
	exe, err := os.Executable()
	require.NoError(t, err)
	cmd := exec.Command(exe, "-addr", "127.0.0.1:0", "-data-dir", t.TempDir())
	cmd.Env = append(os.Environ(), "DEVKAFKA_RUN_MAIN=1")
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill() })

	// stderr is only read after Wait: exec copies into it concurrently.
	line, err := bufio.NewReader(stdout).ReadString('\n')
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(line, "devkafka listening on 127.0.0.1:"), line)

	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	waitErr := make(chan error, 1)
	go func() { waitErr <- cmd.Wait() }()
	select {
	case err := <-waitErr:
		require.NoError(t, err, "exit status; stderr: %s", stderr.String())
	case <-time.After(10 * time.Second):
		t.Fatal("devkafka did not exit after SIGTERM")
	}
	require.Contains(t, stderr.String(), "devkafka: stopped")
}
