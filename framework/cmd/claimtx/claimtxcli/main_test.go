package claimtxcli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/internal/testenv"
	"github.com/claimtx/claimtx/store"
)

// cli runs the command line in-process against its own schema.
type cli struct {
	t      *testing.T
	schema string
	env    map[string]string
	cfg    Config // what an embedding program passes to Run
}

func newCLI(t *testing.T) *cli {
	t.Helper()
	return &cli{t: t, schema: testenv.NewSchema(t), env: map[string]string{"DATABASE_URL": testenv.URL()}}
}

// migratedCLI is newCLI after a successful `claimtx migrate`, where most
// commands start.
func migratedCLI(t *testing.T) *cli {
	t.Helper()
	c := newCLI(t)
	c.ok("migrate")
	return c
}

func (c *cli) run(args ...string) (code int, stdout, stderr string) {
	c.t.Helper()
	env := map[string]string{"CLAIMTX_SCHEMA": c.schema}
	for k, v := range c.env {
		env[k] = v
	}
	var out, errOut bytes.Buffer
	code = runEnv(context.Background(), c.cfg, args, &out, &errOut, func(k string) string { return env[k] })
	return code, out.String(), errOut.String()
}

func (c *cli) ok(args ...string) string {
	c.t.Helper()
	code, out, errOut := c.run(args...)
	require.Equal(c.t, exitOK, code, "claimtx %v\nstdout: %s\nstderr: %s", args, out, errOut)
	return out
}

// usageCase is a command line refused as bad input, with want in its
// error.
type usageCase struct {
	args []string
	want string
}

// refuses runs each case's command line and requires exit status 2 and
// the case's text on stderr.
func (c *cli) refuses(cases []usageCase) {
	c.t.Helper()
	for _, tc := range cases {
		code, out, errOut := c.run(tc.args...)
		require.Equal(c.t, exitUsage, code, "%v: %s %s", tc.args, out, errOut)
		require.Contains(c.t, errOut, tc.want, "%v", tc.args)
	}
}

func (c *cli) store() *store.Store {
	c.t.Helper()
	st, err := store.New(testenv.Pool(c.t, c.schema, 4), store.Config{Schema: c.schema})
	require.NoError(c.t, err)
	return st
}

func (c *cli) exec(sql string, args ...any) {
	c.t.Helper()
	_, err := testenv.Pool(c.t, c.schema, 1).Exec(context.Background(), sql, args...)
	require.NoError(c.t, err)
}

func TestCLIMigrateStatsCleanup(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	out := c.ok("migrate")
	require.Contains(t, out, fmt.Sprintf("migrated schema %s to version %d (was 0)", c.schema, store.SchemaVersion))
	require.Contains(t, c.ok("migrate"), "already at version")

	table := pgx.Identifier{c.schema, "processed_messages"}.Sanitize()
	c.exec(`INSERT INTO ` + table + ` (consumer, message_key, processed_at)
SELECT CASE WHEN g % 2 = 0 THEN 'loyalty' ELSE 'analytics' END, 'k' || g, now() - (g || ' days')::interval FROM generate_series(1, 60) g`)

	out = c.ok("stats")
	require.Contains(t, out, "plain")
	require.Regexp(t, `analytics\s+30\s`, out)
	require.Regexp(t, `loyalty\s+30\s`, out)
	require.Contains(t, out, "total 60 claims")
	require.Contains(t, out, "per claim")

	var js store.Stats
	require.NoError(t, json.Unmarshal([]byte(c.ok("stats", "--json")), &js))
	require.EqualValues(t, 60, js.Claims)

	// Days 30..60 are outside a 30-day window (day 30 by a hair).
	out = c.ok("cleanup", "--dry-run")
	require.Contains(t, out, "dry run: 31 claims")
	out = c.ok("cleanup", "--window", "30d", "--batch-size", "4", "--min-batch-size", "4", "--max-batch-size", "4", "--pause", "-1ns", "--progress", "log", "--vacuum")
	require.Contains(t, out, "cleanup: 31 claims processed before")
	require.Contains(t, out, "31 claims processed before")
	require.Contains(t, out, "in 9 batches")
	require.Contains(t, out, "then vacuumed")
	require.Contains(t, c.ok("stats"), "total 29 claims")

	// --window in hours works, and a bar can be forced.
	out = c.ok("cleanup", "--window", "480h", "--progress", "bar", "--pause", "-1ns")
	require.Contains(t, out, "\r")
	require.Contains(t, out, "ETA")
	require.Contains(t, out, "10 claims processed before")
	require.Contains(t, c.ok("stats"), "total 19 claims")
}

func TestCLIBadInput(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	c.refuses([]usageCase{
		{nil, "Usage:"},
		{[]string{"frobnicate"}, `unknown command "frobnicate"`},
		{[]string{"cleanup", "--window", "1d"}, "--window 1d is below --min-window 7d"},
		{[]string{"cleanup", "--window", "thirty days"}, "not a duration"},
		{[]string{"cleanup", "--batch-size", "-5"}, "BatchSize"},
		{[]string{"cleanup", "--progress", "sparkles"}, "--progress"},
		{[]string{"cleanup", "extra"}, `unexpected argument "extra"`},
		{[]string{"cleanup", "--no-such-flag"}, "no-such-flag"},
		{[]string{"partitions"}, "want a subcommand"},
		{[]string{"partitions", "shuffle"}, `unknown subcommand "shuffle"`},
		{[]string{"partitions", "drop-expired", "--retention", "2d"}, "--retention 2d is below --min-retention 7d"},
		{[]string{"partitions", "create-ahead", "--ahead", "-1"}, "Ahead"},
		{[]string{"stats", "--schema", "Bad-Name"}, `"Schema"`},
		{[]string{"stats", "--table", "x;drop"}, `"ClaimsTable"`},
	})

	c.env = map[string]string{}
	code, _, errOut := c.run("stats")
	require.Equal(t, exitUsage, code)
	require.Contains(t, errOut, "DATABASE_URL")

	code, out, _ := c.run("help")
	require.Equal(t, exitOK, code)
	require.Contains(t, out, "Usage:")
	code, _, _ = c.run("cleanup", "-h")
	require.Equal(t, exitOK, code)
}

// The password never reaches the output, whatever form the connection
// string takes and whichever step fails.
func TestCLINeverPrintsThePassword(t *testing.T) {
	t.Parallel()
	const secret = "s3cr3t-Pw"
	c := newCLI(t)
	for _, dsn := range []string{
		"postgres://alice:" + secret + "@127.0.0.1:1/db?sslmode=disable&connect_timeout=2", // refused
		"postgres://alice:" + secret + "@127.0.0.1:notaport/db",                            // unparsable
		"host=127.0.0.1 port=1 user=alice password=" + secret + " dbname=db sslmode=disable connect_timeout=2",
		"host=127.0.0.1 port=1 user=alice password='" + secret + "' dbname=db sslmode=disable connect_timeout=2",
		"postgres://127.0.0.1:1/db?user=alice&password=" + secret + "&sslmode=disable&connect_timeout=2",
		"postgres://alice:" + secret + "@127.0.0.1:1/db?sslmode=bogus",
	} {
		c.env = map[string]string{"DATABASE_URL": dsn}
		for _, args := range [][]string{{"stats"}, {"migrate"}, {"cleanup", "--dry-run"}, {"partitions", "list"}} {
			code, out, errOut := c.run(args...)
			require.NotEqual(t, exitOK, code, "%v with %s", args, dsn)
			require.NotContains(t, out+errOut, secret, "%v", args)
			require.NotEmpty(t, errOut)
		}
	}
	// Flag defaults printed by -h, and flag errors, never show it.
	c.env = map[string]string{"DATABASE_URL": "postgres://alice:" + secret + "@127.0.0.1:1/db"}
	for _, args := range [][]string{{"cleanup", "-h"}, {"stats", "--bogus"}, {"partitions", "list", "-h"}} {
		_, out, errOut := c.run(args...)
		if args[len(args)-1] == "-h" {
			require.Contains(t, out, "database-url", "%v", args)
		}
		require.NotContains(t, out+errOut, secret, "%v", args)
	}

	// A wrong password against the real server: authentication may not be
	// required there (trust), but the message must still not echo it.
	c.env = map[string]string{"DATABASE_URL": strings.Replace(testenv.URL(), "postgres@", "postgres:"+secret+"@", 1)}
	code, out, errOut := c.run("cleanup", "--dry-run")
	require.NotContains(t, out+errOut, secret)
	require.Equal(t, exitFail, code, "no claim table yet: %s", errOut)
	require.Contains(t, errOut, "claimtx migrate")
}

func TestCLIPartitions(t *testing.T) {
	t.Parallel()
	c := migratedCLI(t)
	code, _, errOut := c.run("partitions", "list")
	require.Equal(t, exitFail, code)
	require.Contains(t, errOut, "not partitioned")

	out := c.ok("partitions", "enable", "--ahead", "3")
	require.Contains(t, out, "now partitioned by event day: 34 day partitions created")
	require.Contains(t, c.ok("partitions", "enable", "--ahead", "3"), "already partitioned; created 0")
	out = c.ok("partitions", "list")
	require.Contains(t, out, "NAME")
	require.Equal(t, 34, strings.Count(out, "processed_messages_p"), out)

	out = c.ok("partitions", "create-ahead", "--ahead", "5", "--dry-run")
	require.Contains(t, out, "would create 2 partitions")
	out = c.ok("partitions", "create-ahead", "--ahead", "5")
	require.Contains(t, out, "created 2 partitions")
	require.Contains(t, c.ok("partitions", "create-ahead", "--ahead", "5"), "created 0 partitions")

	out = c.ok("partitions", "drop-expired", "--retention", "10d", "--dry-run")
	require.Contains(t, out, "would drop 20 partitions past the 10d retention")
	out = c.ok("partitions", "drop-expired", "--retention", "10d")
	require.Contains(t, out, "dropped 20 partitions")
	require.Contains(t, c.ok("partitions", "drop-expired", "--retention", "10d"), "dropped 0 partitions")
	require.Contains(t, c.ok("stats"), "partitioned by event day, 16 partitions")

	code, _, errOut = c.run("cleanup")
	require.Equal(t, exitFail, code)
	require.Contains(t, errOut, "partitions drop-expired")
}

func TestCLIPrepareThenEnable(t *testing.T) {
	t.Parallel()
	c := migratedCLI(t)
	c.exec(`INSERT INTO ` + pgx.Identifier{c.schema, "processed_messages"}.Sanitize() + ` (consumer, message_key) VALUES ('c', 'k')`)
	require.Contains(t, c.ok("partitions", "enable", "--prepare-only"), "switch consumers")
	out := c.ok("partitions", "enable", "--ahead", "2")
	require.Contains(t, out, "existing claims kept as processed_messages_legacy")
	require.Contains(t, out, "1 day partitions created")
}

// A second cleaner started while the first runs reports "not leader" and
// succeeds without doing anything, as every instance's cron job but one
// should.
func TestCLINotLeader(t *testing.T) {
	t.Parallel()
	c := migratedCLI(t)
	c.exec(`INSERT INTO ` + pgx.Identifier{c.schema, "processed_messages"}.Sanitize() + ` (consumer, message_key, processed_at)
SELECT 'c', 'k' || g, now() - interval '40 days' FROM generate_series(1, 20) g`)
	st := c.store()
	var code int
	var out string
	_, err := st.Cleanup(context.Background(), store.RetentionConfig{BatchSize: 5, MinBatchSize: 5, MaxBatchSize: 5, Pause: -1,
		OnProgress: func(p store.CleanupResult) {
			if p.Batches == 1 {
				code, out, _ = c.run("cleanup")
			}
		}})
	require.NoError(t, err)
	require.Equal(t, exitOK, code)
	require.Contains(t, out, "not leader")

	// The same for partition maintenance.
	c.ok("partitions", "enable")
	st2 := c.store()
	_, err = st2.Cleanup(context.Background(), store.RetentionConfig{DryRun: true})
	require.ErrorIs(t, err, store.ErrPartitioned)
}

func TestProgressPrinter(t *testing.T) {
	t.Parallel()
	now := time.Unix(0, 0)
	var buf bytes.Buffer
	p := &progressPrinter{progress: progress{w: &buf, mode: "bar", now: func() time.Time { return now }}, total: 1000, counted: true}
	p.update(store.CleanupResult{})
	p.update(store.CleanupResult{Batches: 1, Deleted: 250, BatchRows: 250, Duration: time.Second})
	now = now.Add(time.Second)
	p.update(store.CleanupResult{Batches: 2, Deleted: 500, BatchRows: 250, Duration: 2 * time.Second})
	p.update(store.CleanupResult{Batches: 3, Deleted: 500, BatchRows: 0, Duration: 2 * time.Second})
	p.finish()
	out := buf.String()
	require.Contains(t, out, "[###############...............]  50%  500/1000 claims  250/s  ETA 2s")
	require.Contains(t, out, "100%")
	require.NotContains(t, out, "25%", "redraws are throttled")
	require.True(t, strings.HasSuffix(out, "\n"))

	buf.Reset()
	p = &progressPrinter{progress: progress{w: &buf, mode: "log", now: func() time.Time { return now }}, total: 100, counted: true}
	for i := 1; i <= 10; i++ {
		p.update(store.CleanupResult{Batches: i, Deleted: int64(i * 10), BatchRows: 10, Duration: time.Duration(i) * time.Second})
	}
	require.Equal(t, 1, strings.Count(buf.String(), "\n"), "log lines are throttled: %s", buf.String())

	// Not counted (too many to count in the budget): no percentage and no
	// ETA; a spinner shows life.
	for _, mode := range []string{"bar", "log"} {
		buf.Reset()
		p = &progressPrinter{progress: progress{w: &buf, mode: mode, now: func() time.Time { return now }}}
		p.update(store.CleanupResult{})
		now = now.Add(time.Minute)
		p.update(store.CleanupResult{Batches: 1, Deleted: 250, BatchRows: 250, Duration: time.Second})
		p.finish()
		out = buf.String()
		require.NotContains(t, out, "%", mode)
		require.NotContains(t, out, "1000", mode)
		require.NotContains(t, out, "ETA", mode)
		require.Contains(t, out, "250 claims deleted in 1 batches", mode)
	}
	require.Contains(t, buf.String(), "no total")

	require.False(t, isTerminal(&buf))
}

// formatBytes is the size of the stats and partitions tables; the
// durations' parsing and printing are opfmt's (opfmt/duration_test.go).
func TestFormatBytes(t *testing.T) {
	t.Parallel()
	require.Equal(t, "1.5 KiB", formatBytes(1536))
	require.Equal(t, "12 B", formatBytes(12))
}

// Issue 13, item 6: what an operator reads. Each case failed before the
// CLI polish; together they pin the messages down.

// An error is prefixed once, and a missing table or schema is named.
func TestCLIErrorsNameWhatIsMissing(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	for _, args := range [][]string{{"cleanup"}, {"cleanup", "--dry-run"}, {"stats"}, {"partitions", "list"}, {"partitions", "drop-expired"}, {"partitions", "create-ahead"}} {
		code, _, errOut := c.run(args...)
		require.Equal(t, exitFail, code, "%v: %s", args, errOut)
		require.Equal(t, 1, strings.Count(errOut, "claimtx:"), "%v: one prefix: %s", args, errOut)
		require.Contains(t, errOut, c.schema+".processed_messages does not exist", "%v", args)
		require.Contains(t, errOut, "claimtx migrate", "%v", args)
		require.NotContains(t, errOut, "Migrate first", "%v: the Go API's advice is not the CLI's", args)
	}
	// A schema that does not exist is named as such.
	c.env["CLAIMTX_SCHEMA"] = "no_such_schema_cli"
	code, _, errOut := c.run("stats", "--schema", "no_such_schema_cli")
	require.Equal(t, exitFail, code)
	require.Contains(t, errOut, `schema "no_such_schema_cli" does not exist`)
}

// The wrong table layout is named too, with the command that fits it
// rather than the Go API's.
func TestCLIErrorsNameTheLayout(t *testing.T) {
	t.Parallel()
	c := migratedCLI(t)
	table := c.schema + ".processed_messages"
	for _, args := range [][]string{{"partitions", "list"}, {"partitions", "drop-expired"}, {"partitions", "create-ahead"}} {
		code, _, errOut := c.run(args...)
		require.Equal(t, exitFail, code, "%v", args)
		require.Contains(t, errOut, "claim table "+table+" is not partitioned", "%v", args)
		require.Contains(t, errOut, "claimtx partitions enable", "%v", args)
		require.Equal(t, 1, strings.Count(errOut, "claimtx:"), "%v: %s", args, errOut)
	}
	c.ok("partitions", "enable", "--ahead", "1")
	code, _, errOut := c.run("cleanup")
	require.Equal(t, exitFail, code)
	require.Contains(t, errOut, "claim table "+table+" is partitioned")
	require.Contains(t, errOut, "claimtx partitions drop-expired")
	require.NotContains(t, errOut, "DropExpiredPartitions")
}

// Durations keep the unit the user typed, and the way out names --force.
func TestCLIDurationsAsTyped(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	code, _, errOut := c.run("cleanup", "--window", "3d")
	require.Equal(t, exitUsage, code)
	require.Equal(t, 1, strings.Count(errOut, "claimtx"), errOut)
	require.Contains(t, errOut, "--window 3d is below --min-window 7d")
	require.Contains(t, errOut, "--force")
	require.NotContains(t, errOut, "72h")
	require.NotContains(t, errOut, "force it")

	code, _, errOut = c.run("partitions", "drop-expired", "--retention", "36h", "--min-retention", "2d")
	require.Equal(t, exitUsage, code)
	require.Contains(t, errOut, "--retention 36h is below --min-retention 2d")
	require.Contains(t, errOut, "--force")

	c.ok("migrate")
	c.ok("partitions", "enable", "--ahead", "1")
	require.Contains(t, c.ok("partitions", "drop-expired", "--retention", "240h", "--dry-run"), "past the 240h retention")
	require.Contains(t, c.ok("partitions", "drop-expired", "--dry-run"), "past the 30d retention")
}

// A wrong flag is reported once, with a pointer to -h instead of the whole
// usage around it.
func TestCLIWrongFlagOnce(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	for _, args := range [][]string{{"cleanup", "--no-such-flag"}, {"partitions", "list", "--window", "3d"}, {"migrate", "--bogus=1"}} {
		code, out, errOut := c.run(args...)
		require.Equal(t, exitUsage, code, "%v", args)
		require.Empty(t, out)
		require.Equal(t, 1, strings.Count(errOut, "not defined"), "%v: %s", args, errOut)
		require.Equal(t, 1, strings.Count(errOut, "claimtx:"), "%v: %s", args, errOut)
		require.Contains(t, errOut, "-h` for its flags", "%v", args)
		require.Len(t, strings.Split(strings.TrimSpace(errOut), "\n"), 2, "%v: the error and a hint, no usage: %s", args, errOut)
	}
}

// Help lists each command's own flags, each default once.
func TestCLIHelp(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	help := map[string]string{}
	for _, cmd := range [][]string{{"migrate"}, {"cleanup"}, {"stats"}, {"partitions", "list"}, {"partitions", "enable"}, {"partitions", "create-ahead"}, {"partitions", "drop-expired"}} {
		code, out, errOut := c.run(append(cmd, "-h")...)
		require.Equal(t, exitOK, code, "%v", cmd)
		require.Empty(t, errOut, "%v: help asked for goes to stdout", cmd)
		require.Contains(t, out, "claimtx "+strings.Join(cmd, " "), "%v", cmd)
		require.Contains(t, out, "--database-url", "%v", cmd)
		for _, line := range strings.Split(out, "\n") {
			require.LessOrEqual(t, strings.Count(line, "default"), 1, "%v: %q", cmd, line)
		}
		help[strings.Join(cmd, " ")] = out
	}
	require.Contains(t, help["cleanup"], "(default 30d)")
	require.Contains(t, help["cleanup"], "(default 500, or --batch-size if smaller)")
	// The adaptive bounds still follow a small --batch-size.
	c.ok("migrate")
	require.Contains(t, c.ok("cleanup", "--batch-size", "100", "--dry-run"), "dry run: 0 claims")
	require.NotContains(t, help["partitions drop-expired"], "--ahead")
	require.NotContains(t, help["partitions drop-expired"], "--prepare-only")
	require.NotContains(t, help["partitions list"], "--retention")
	require.Contains(t, help["partitions create-ahead"], "--ahead")
	require.Contains(t, help["partitions enable"], "--prepare-only")

	code, out, _ := c.run("partitions", "-h")
	require.Equal(t, exitOK, code)
	require.Contains(t, out, "drop-expired")

	// Flags of another subcommand are refused, not silently ignored.
	for _, args := range [][]string{{"partitions", "drop-expired", "--ahead", "99"}, {"partitions", "list", "--dry-run"}, {"partitions", "create-ahead", "--prepare-only"}} {
		code, _, errOut := c.run(args...)
		require.Equal(t, exitUsage, code, "%v: %s", args, errOut)
		require.Contains(t, errOut, "not defined", "%v", args)
	}
}

// A migrate that changes nothing says so.
func TestCLIMigrateUpToDate(t *testing.T) {
	t.Parallel()
	c := migratedCLI(t)
	out := c.ok("migrate")
	require.Contains(t, out, fmt.Sprintf("schema %s is already at version %d, the latest; nothing to do", c.schema, store.SchemaVersion))
	require.NotContains(t, out, "migrated")
}

// The progress total is right on a table cleaned before, where the
// planner's statistics still count the rows the first run deleted.
func TestCLICleanupProgressAfterEarlierCleanup(t *testing.T) {
	t.Parallel()
	c := migratedCLI(t)
	table := pgx.Identifier{c.schema, "processed_messages"}.Sanitize()
	// No autoanalyze between the runs: the stale statistics are the case.
	c.exec(`ALTER TABLE ` + table + ` SET (autovacuum_enabled = false)`)
	// One claim every 0.1 day, 0.15 to 100.05 days old: 501 are older
	// than 50 days, 300 of the rest older than 20.
	c.exec(`INSERT INTO ` + table + ` (consumer, message_key, processed_at)
SELECT 'c', 'k' || g, now() - ((g * 0.1 + 0.05) || ' days')::interval FROM generate_series(1, 1000) g`)
	c.exec(`ANALYZE ` + table)
	require.Contains(t, c.ok("cleanup", "--window", "50d", "--pause", "-1ns", "--progress", "none"), "501 claims processed before")

	out := c.ok("cleanup", "--window", "20d", "--pause", "-1ns", "--progress", "log")
	require.Contains(t, out, "cleanup: 300 claims processed before")
	require.NotContains(t, out, "~")
	require.Contains(t, out, "300 claims processed before")

	out = c.ok("cleanup", "--window", "10d", "--pause", "-1ns", "--progress", "bar")
	require.Contains(t, out, "100/100 claims")
	require.NotContains(t, out, "~")
}
