package consumer

import (
	"log/slog"
	"maps"
	"slices"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/claimtx/claimtx/internal/startup"
)

// StartupError reports that PostgreSQL was not available within
// Config.StartupTimeout, or failed with an error waiting cannot fix. Its
// fields say which Dependency ("PostgreSQL"), the Step start-up was at
// ("migrate claimtx's schema"), the Attempts made, the time Elapsed, and
// Err, the last attempt's error: the real cause, which it unwraps to.
// Branch on it with errors.As. (The brokers report their own start-up
// failures: see brokers/amqp and brokers/kafka.)
type StartupError = startup.Error

// slogAdapter is watermill's slog adapter with a Warn method, which the
// brokers' start-up loops use (through an optional interface) to log what
// they wait for at WARN; watermill.LoggerAdapter has no warning level.
type slogAdapter struct {
	watermill.LoggerAdapter
	l *slog.Logger
}

func newSlogAdapter(l *slog.Logger) slogAdapter {
	return slogAdapter{LoggerAdapter: watermill.NewSlogLogger(l), l: l}
}

// Warn logs msg at WARN with fields in a stable order.
func (a slogAdapter) Warn(msg string, fields watermill.LogFields) {
	a.l.Warn(msg, fieldArgs(fields)...)
}

// With keeps the Warn method on the derived logger.
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
