package consumer

import (
	"context"

	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/internal/startup"
)

// AwaitDatabase runs try, typically the DDL of the effect tables a
// consumer writes to, under the start-up policy New applies to claimtx's
// own schema, so a consumer started with (or before) its database waits
// for it the same way: each attempt pings cfg.Pool first; an error saying
// PostgreSQL is not reachable yet or is starting or failing over is
// retried with backoff within cfg.StartupTimeout, each wait logged at WARN
// to cfg.Logger; an authentication failure or any other error returns at
// once. A failure is a *StartupError naming step ("create the loyalty
// tables") and the last attempt's error. try must be safe to run again (DDL
// in a transaction, IF NOT EXISTS); the deadline bounds each ping, not try.
func AwaitDatabase(ctx context.Context, cfg Config, step string, try func(context.Context) error) error {
	if cfg.Pool == nil {
		return &framework.ConfigError{Field: "Pool", Reason: "AwaitDatabase needs the pool to wait for"}
	}
	return startup.AwaitDatabase(ctx, cfg.Logger, cfg.StartupTimeout, cfg.Pool, step, try)
}
