package consumer

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/internal/config"
	"github.com/claimtx/claimtx/internal/pg"
	"github.com/claimtx/claimtx/store"
)

// AwaitDatabase runs try, typically the DDL of the effect tables, under
// New's start-up policy (docs/operations.md), pinging cfg.Pool before each
// attempt. A failure is a *StartupError naming step. try must be safe to
// run again; the deadline bounds each ping, not try.
func AwaitDatabase(ctx context.Context, cfg Config, step string, try func(context.Context) error) error {
	if cfg.Pool == nil {
		return &framework.ConfigError{Field: "Pool", Reason: "AwaitDatabase needs the pool to wait for"}
	}
	err := awaitDatabase(ctx, cfg.Logger, cfg.StartupTimeout, cfg.Pool, cfg.poolerField(), step, try)
	var se *StartupError
	if errors.As(err, &se) && errors.Is(se.Err, store.ErrTransactionPooler) {
		se.Err = cfg.named(se.Err)
	}
	return err
}

// poolerField is the setting a start-up failure behind a transaction
// pooler names: the URL, where the fix goes, when the Config has one.
func (c Config) poolerField() string {
	if c.DatabaseURL != "" {
		return "DatabaseURL"
	}
	return "Pool"
}

// poolerError returns err as a ConfigError naming field when it is a
// start-up failure behind a transaction pooler (Migrate's refusal, or pgx's
// statement cache failing before that); nil otherwise.
func poolerError(field string, err error) error {
	switch {
	case errors.Is(err, store.ErrTransactionPooler) && errors.As(err, new(*framework.ConfigError)):
		return config.Rename(err, func(string) (string, bool) { return field, true })
	case pg.IsPreparedStatementError(err):
		return &framework.ConfigError{Field: field, Reason: pg.PoolerReason, Err: poolerCause{err}}
	}
	return nil
}

// poolerCause is pgx's prepared statement error, matching
// store.ErrTransactionPooler too.
type poolerCause struct{ err error }

func (e poolerCause) Error() string        { return e.err.Error() }
func (e poolerCause) Unwrap() error        { return e.err }
func (e poolerCause) Is(target error) bool { return target == store.ErrTransactionPooler }

const (
	defaultStartupTimeout = 30 * time.Second
	// Start-up retry backoff, doubled up to the maximum.
	startupInitialBackoff = 100 * time.Millisecond
	startupMaxBackoff     = 2 * time.Second
)

// StartupError reports that PostgreSQL was not available within
// Config.StartupTimeout, or failed with an error waiting cannot fix.
type StartupError struct {
	Dependency string        // "PostgreSQL"
	Step       string        // what start-up was doing: "migrate claimtx's schema"
	Attempts   int           // attempts made
	Elapsed    time.Duration // time spent trying
	Err        error         // the last attempt's error
}

func (e *StartupError) Error() string {
	return fmt.Sprintf("claimtx: start-up: %s (%s): gave up after %d attempt(s) in %s: %v",
		e.Dependency, e.Step, e.Attempts, e.Elapsed.Round(time.Millisecond), e.Err)
}

func (e *StartupError) Unwrap() error { return e.Err }

// awaitDatabase is AwaitDatabase's policy: each attempt pings pool within
// the deadline, then runs try with ctx (a migration may outlast it).
func awaitDatabase(ctx context.Context, logger *slog.Logger, timeout time.Duration, pool *pgxpool.Pool, field, step string, try func(context.Context) error) error {
	classify := func(err error) (bool, error) {
		if perr := poolerError(field, err); perr != nil {
			return false, perr
		}
		return classifyPostgres(err)
	}
	return await(ctx, cmp.Or(logger, slog.Default()), cmp.Or(timeout, defaultStartupTimeout), "PostgreSQL", step, classify, func(actx context.Context) error {
		if err := pool.Ping(actx); err != nil {
			return err
		}
		return try(ctx)
	})
}

// await calls try until it succeeds, classify refuses a retry, ctx ends or
// timeout passed (negative: one attempt); each attempt's context ends at
// the deadline. Failures are *StartupError.
func await(ctx context.Context, logger *slog.Logger, timeout time.Duration, dependency, step string,
	classify func(error) (retry bool, wrapped error), try func(context.Context) error,
) error {
	start := time.Now()
	actx := ctx
	if timeout > 0 {
		var cancel context.CancelFunc
		actx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	wait := startupInitialBackoff
	var last error
	for attempt := 1; ; attempt++ {
		err := try(actx)
		if err == nil {
			if attempt > 1 {
				logger.Info("claimtx: start-up: dependency available", "dependency", dependency, "step", step,
					"attempts", attempt, "waited", time.Since(start).Round(time.Millisecond))
			}
			return nil
		}
		fail := func(err error) error {
			return &StartupError{Dependency: dependency, Step: step, Attempts: attempt, Elapsed: time.Since(start), Err: err}
		}
		retry, err := classify(err)
		// An attempt cut short by the deadline says less than the one before.
		if actx.Err() != nil && ctx.Err() == nil && last != nil && errors.Is(err, context.DeadlineExceeded) {
			err = fmt.Errorf("%w (last error: %w)", context.DeadlineExceeded, last)
		}
		last = err
		if !retry || timeout < 0 || actx.Err() != nil {
			return fail(err)
		}
		remaining := timeout - time.Since(start)
		logger.Warn("claimtx: start-up: waiting for dependency", "dependency", dependency, "step", step,
			"attempt", attempt, "retry_in", min(wait, remaining).Round(time.Millisecond).String(),
			"remaining", remaining.Round(time.Millisecond).String(), "err", err.Error())
		if pg.Sleep(actx, min(wait, remaining)) != nil {
			return fail(fmt.Errorf("%w (last error: %w)", actx.Err(), err))
		}
		wait = min(2*wait, startupMaxBackoff)
	}
}

// classifyPostgres tells start-up errors worth waiting for (unreachable,
// starting, shutting down, out of connections); bad credentials are an
// *framework.AuthError.
func classifyPostgres(err error) (bool, error) {
	switch pg.SQLState(err) {
	case "28P01", "28000":
		return false, &framework.AuthError{Dependency: "PostgreSQL", Err: err}
	case "53300": // too_many_connections
		return true, err
	case "":
		// Not the server's: a refused or reset dial, the pool's timeout.
		if errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) || pgconn.Timeout(err) {
			return true, err
		}
	}
	// SQLSTATE class 08, 57P01-57P03 (starting, shutting down), no answer.
	return pg.Classify(err) == pg.Connection, err
}
