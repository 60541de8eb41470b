package consumer

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/brokers"
	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/internal/testenv"
	"github.com/claimtx/claimtx/store"
)

const poolerHint = "transaction pooler (PgBouncer pool_mode=transaction?): pgx's statement cache cannot work there: add default_query_exec_mode=exec to the URL"

// pgx's statement cache failing on a pooled server is a configuration
// error, not retried, whoever met it first.
func TestPreparedStatementErrorIsPermanent(t *testing.T) {
	t.Parallel()
	for _, code := range []string{"26000", "42P05"} {
		var attempts atomic.Int32
		cause := &pgconn.PgError{Code: code, Message: `prepared statement "stmtcache_1" does not exist`}
		classify := func(err error) (bool, error) {
			if perr := poolerError("DatabaseURL", err); perr != nil {
				return false, perr
			}
			return classifyPostgres(err)
		}
		err := await(t.Context(), slog.New(slog.DiscardHandler), time.Minute, "PostgreSQL", "test", classify, func(context.Context) error {
			attempts.Add(1)
			return fmt.Errorf("advisory lock: %w", cause)
		})
		require.Equal(t, int32(1), attempts.Load(), code)
		require.ErrorIs(t, err, store.ErrTransactionPooler, code)
		require.ErrorIs(t, err, cause, code)
		var ce *framework.ConfigError
		require.ErrorAs(t, err, &ce, code)
		require.Equal(t, "DatabaseURL", ce.Field)
		require.Contains(t, err.Error(), poolerHint)
	}
}

// Through a real PgBouncer in transaction mode with pgx's default query
// mode, New refuses the URL at once, naming it as the user wrote it; the
// fix the message gives works.
func TestNewBehindTransactionPooler(t *testing.T) {
	bouncer, cached := startPgBouncer(t)
	schema := testenv.NewSchema(t)
	noop := func(context.Context, pgx.Tx, *message.Message) error { return nil }
	gochannel := brokers.Config{Kind: brokers.KindGoChannel}
	gochannel.GoChannel.Name = schema

	start := time.Now()
	_, err := New(t.Context(), Config{
		Name: "pooled", Topic: "t", Key: "metadata:event_id", DatabaseURL: cached,
		Store: store.Config{Schema: schema}, Broker: gochannel, Logger: slog.New(slog.DiscardHandler),
	}, noop)
	ce := requireField(t, err, "DatabaseURL", "%v", err)
	require.ErrorIs(t, err, store.ErrTransactionPooler)
	require.Contains(t, ce.Error(), poolerHint)
	require.Less(t, time.Since(start), 10*time.Second, "not retried for StartupTimeout")

	// From the environment, the error names the variable.
	c, err := loadCase(t, "", []string{"DATABASE_URL=" + cached, "CONSUMER_NAME=pooled", "TOPIC=t", "KEY=metadata:event_id"})
	require.NoError(t, err)
	c.Store, c.Broker, c.Logger = store.Config{Schema: schema}, gochannel, slog.New(slog.DiscardHandler)
	_, err = New(t.Context(), c, noop)
	requireField(t, err, "DATABASE_URL", "%v", err)
	require.ErrorIs(t, err, store.ErrTransactionPooler)

	// With the fix, the same consumer starts.
	c.DatabaseURL = bouncer
	cons, err := New(t.Context(), c, noop)
	require.NoError(t, err)
	require.NoError(t, cons.Close())
}

// A consumer's own DDL run before New (AwaitDatabase), on a pool with
// pgx's statement cache behind a transaction pooler, meets another
// client's prepared statement on the server it is lent: the start-up
// policy reports it as the same configuration error, at the first attempt.
func TestAwaitDatabaseBehindTransactionPooler(t *testing.T) {
	t.Parallel()
	_, cached := startPgBouncer(t)
	var err error
	const stmt = "SELECT 1 + $1::int"
	pools := make([]*pgxpool.Pool, 2)
	for i := range pools {
		pools[i], err = pgxpool.New(t.Context(), cached)
		require.NoError(t, err)
		t.Cleanup(pools[i].Close)
	}
	// The other instance prepared it first on the server both are lent
	// (PgBouncer reuses the last idle server).
	_, err = pools[0].Exec(t.Context(), stmt, 1)
	require.NoError(t, err)

	var attempts atomic.Int32
	err = AwaitDatabase(t.Context(), Config{Pool: pools[1], DatabaseURL: cached, StartupTimeout: time.Minute, Logger: slog.New(slog.DiscardHandler)},
		"create the tables", func(ctx context.Context) error {
			attempts.Add(1)
			_, err := pools[1].Exec(ctx, stmt, 1)
			return err
		})
	var se *StartupError
	require.ErrorAs(t, err, &se)
	require.Equal(t, "create the tables", se.Step)
	require.Equal(t, int32(1), attempts.Load())
	require.ErrorIs(t, err, store.ErrTransactionPooler)
	var ce *framework.ConfigError
	require.ErrorAs(t, err, &ce)
	require.Equal(t, "DatabaseURL", ce.Field)
	require.Contains(t, err.Error(), poolerHint)
	require.Contains(t, err.Error(), "prepared statement", "the raw cause is kept")
}

// startPgBouncer starts a PgBouncer in transaction mode before the test
// database and returns its URL and the same URL without
// default_query_exec_mode, so pgx caches statements behind the pooler.
func startPgBouncer(t *testing.T) (bouncer, cached string) {
	t.Helper()
	direct, err := pgx.ParseConfig(testenv.DirectURL())
	require.NoError(t, err)
	bouncer = testenv.StartPgBouncer(t, direct.Host, int(direct.Port))
	u, err := url.Parse(bouncer)
	require.NoError(t, err)
	q := u.Query()
	q.Del("default_query_exec_mode")
	u.RawQuery = q.Encode()
	return bouncer, u.String()
}
