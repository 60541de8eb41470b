package claimtxcli

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/internal/testenv"
	"github.com/claimtx/claimtx/store"
)

// envMigrateChild makes TestMigrateProcessChild run `claimtx migrate`.
const envMigrateChild = "CLAIMTX_TEST_CLI_MIGRATE_CHILD"

// TestMigrateColdStartProcesses runs `claimtx migrate` from several
// processes at once on an empty database (the default schema), as a deploy
// running it on every host does, over several rounds: all must exit 0 and
// leave the schema at the latest version.
func TestMigrateColdStartProcesses(t *testing.T) {
	t.Parallel()
	const rounds, procs = 8, 4
	failures := 0
	for round := range rounds {
		dbURL := testenv.NewDatabase(t)
		cmds := make([]*exec.Cmd, procs)
		outs := make([]*bytes.Buffer, procs)
		for i := range cmds {
			cmd := exec.Command(os.Args[0], "-test.run=^TestMigrateProcessChild$", "-test.count=1")
			cmd.Env = append(os.Environ(), envMigrateChild+"=1", "DATABASE_URL="+dbURL, "CLAIMTX_SCHEMA=")
			outs[i] = &bytes.Buffer{}
			cmd.Stdout, cmd.Stderr = outs[i], outs[i]
			require.NoError(t, cmd.Start())
			cmds[i] = cmd
		}
		for i, cmd := range cmds {
			if err := cmd.Wait(); err != nil {
				failures++
				t.Errorf("round %d, process %d: %v\n%s", round, i, err, outs[i])
			}
		}
		require.Equal(t, store.SchemaVersion, versionAt(t, dbURL), "round %d: schema version after the cold start", round)
	}
	t.Logf("%d of %d `claimtx migrate` processes failed", failures, rounds*procs)
}

// TestMigrateProcessChild is one `claimtx migrate` of
// TestMigrateColdStartProcesses; without its environment it does nothing.
func TestMigrateProcessChild(t *testing.T) {
	if os.Getenv(envMigrateChild) == "" {
		t.Skip("only run as a child process of TestMigrateColdStartProcesses")
	}
	var out, errOut bytes.Buffer
	code := runEnv(context.Background(), Config{}, []string{"migrate"}, &out, &errOut, os.Getenv)
	require.Equal(t, exitOK, code, "stdout: %s\nstderr: %s", out.String(), errOut.String())
}

func versionAt(t *testing.T, dbURL string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool, err := pgxpool.New(ctx, dbURL)
	require.NoError(t, err)
	defer pool.Close()
	st, err := store.New(pool, store.Config{})
	require.NoError(t, err)
	v, err := st.Version(ctx)
	require.NoError(t, err)
	return v
}
