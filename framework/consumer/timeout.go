package consumer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
)

// HandlerTimeoutError reports an attempt cut off by Config.HandlerTimeout;
// it unwraps to what the attempt returned, and is not permanent.
type HandlerTimeoutError struct {
	Timeout time.Duration
	Err     error
}

func (e *HandlerTimeoutError) Error() string {
	return fmt.Sprintf("claimtx: handler did not finish within %s: %v", e.Timeout, e.Err)
}

func (e *HandlerTimeoutError) Unwrap() error { return e.Err }

// handlerTimeout gives each attempt a deadline of d. Unlike Watermill's
// Timeout it restores the context, so a retry does not inherit it expired.
func handlerTimeout(d time.Duration) message.HandlerMiddleware {
	return func(h message.HandlerFunc) message.HandlerFunc {
		if d <= 0 {
			return h
		}
		return func(msg *message.Message) ([]*message.Message, error) {
			orig := msg.Context()
			ctx, cancel := context.WithTimeout(orig, d)
			msg.SetContext(ctx)
			defer func() {
				cancel()
				msg.SetContext(orig)
			}()
			out, err := h(msg)
			if err != nil && orig.Err() == nil && errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return out, &HandlerTimeoutError{Timeout: d, Err: err}
			}
			return out, err
		}
	}
}
