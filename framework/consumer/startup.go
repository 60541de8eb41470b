package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/claimtx/claimtx/internal/poison"
)

// slogAdapter is watermill's slog adapter with the Warn method the
// brokers' start-up loops look for.
type slogAdapter struct {
	watermill.LoggerAdapter
	l *slog.Logger
}

func newSlogAdapter(l *slog.Logger) slogAdapter {
	return slogAdapter{LoggerAdapter: watermill.NewSlogLogger(l), l: l}
}

// Warn logs at WARN with fields in a stable order.
func (a slogAdapter) Warn(msg string, fields watermill.LogFields) {
	a.l.Warn(msg, fieldArgs(fields)...)
}

// Error bounds err's text like a poison reason: Watermill logs a handler
// error per retry and nack, and logPoisoned logs it whole once.
func (a slogAdapter) Error(msg string, err error, fields watermill.LogFields) {
	a.LoggerAdapter.Error(msg, boundError(err), fields)
}

// boundError is err with its text bounded; it unwraps to err.
func boundError(err error) error {
	if err == nil {
		return nil
	}
	text, cut := poison.BoundReason(err.Error(), poison.MaxReasonBytes)
	if !cut {
		return err
	}
	return &boundedError{text: text, err: err}
}

type boundedError struct {
	text string
	err  error
}

func (e *boundedError) Error() string { return e.text }
func (e *boundedError) Unwrap() error { return e.err }

func (a slogAdapter) With(fields watermill.LogFields) watermill.LoggerAdapter {
	return slogAdapter{LoggerAdapter: a.LoggerAdapter.With(fields), l: a.l.With(fieldArgs(fields)...)}
}

func fieldArgs(fields watermill.LogFields) []any {
	args := make([]any, 0, 2*len(fields))
	for _, k := range slices.Sorted(maps.Keys(fields)) {
		args = append(args, k, fields[k])
	}
	return args
}

// connectBroker runs build, which takes no context, so that New returns as
// soon as ctx ends (a SIGTERM must not wait out the dial timeout); a client
// built later is closed.
func connectBroker[T interface{ Close() error }](ctx context.Context, build func() (T, error)) (T, error) {
	type result struct {
		client T
		err    error
	}
	done := make(chan result, 1)
	go func() {
		c, err := build()
		done <- result{c, err}
	}()
	select {
	case r := <-done:
		return r.client, r.err
	case <-ctx.Done():
		go func() {
			if r := <-done; r.err == nil {
				_ = r.client.Close()
			}
		}()
		var zero T
		// The cause says why (a signal); ctx.Err is what callers match.
		err := ctx.Err()
		if cause := context.Cause(ctx); !errors.Is(cause, err) {
			err = errors.Join(err, cause)
		}
		return zero, fmt.Errorf("claimtx: start-up stopped while connecting to the broker: %w", err)
	}
}
