package kafka

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/claimtx/claimtx/brokers"
	"github.com/claimtx/claimtx/brokers/internal/wait"
	"github.com/claimtx/claimtx/brokers/internal/warnlog"
)

// retryStart calls try until it succeeds, ctx ends or cfg.DialTimeout has
// passed, waiting cfg.ReconnectBackoff in between; a closed subscriber or
// refused credentials end it at once. what names the operation.
func retryStart(ctx context.Context, cfg brokers.KafkaConfig, logger watermill.LoggerAdapter, what string, try func() error) error {
	start := time.Now()
	for attempt := 1; ; attempt++ {
		err := try()
		if err == nil {
			return nil
		}
		if errors.Is(err, errSubscriberClosed) {
			return fmt.Errorf("brokers/kafka: %s: %w", what, err)
		}
		fail := func(cause error) error {
			return fmt.Errorf("brokers/kafka: %s at %v: gave up after %d attempt(s) in %s: %w",
				what, cfg.Brokers, attempt, time.Since(start).Round(time.Millisecond), cause)
		}
		if authErr := authError(cfg, err); authErr != nil {
			return fmt.Errorf("brokers/kafka: %s at %v: %w", what, cfg.Brokers, authErr)
		}
		// Before the deadline: a caller that cancelled wants its own error.
		if ctxErr := ctx.Err(); ctxErr != nil {
			return fail(errors.Join(ctxErr, err))
		}
		remaining := cfg.DialTimeout - time.Since(start)
		if cfg.DialTimeout < 0 || remaining <= 0 {
			return fail(err)
		}
		warnlog.Log(logger, "Kafka not reachable yet, retrying", watermill.LogFields{
			"dependency": "Kafka", "brokers": cfg.Brokers, "operation": what, "attempt": attempt, "err": err.Error(),
		})
		if !wait.For(min(cfg.ReconnectBackoff, remaining), ctx.Done()) {
			return fail(errors.Join(ctx.Err(), err))
		}
	}
}
