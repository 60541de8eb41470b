package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
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
