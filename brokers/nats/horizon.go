package nats

import (
	"context"
	"errors"
	"fmt"
	"time"

	natsgo "github.com/nats-io/nats.go"

	"github.com/claimtx/claimtx/brokers"
)

// ReplayHorizon reports how old a message of topic can be when JetStream
// still delivers it: its stream's max_age, else brokers.UnboundedHorizon
// (also for a subject streams: create has no stream for yet). Count and
// size limits only remove messages sooner. A consumer compares it with its
// claim retention.
func (s *subscriber) ReplayHorizon(ctx context.Context, topic string) (time.Duration, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	subject, err := s.s.subject(topic)
	if err != nil {
		return 0, err
	}
	name, err := s.js.StreamNameBySubject(subject, natsgo.Context(ctx))
	if errors.Is(err, natsgo.ErrNoMatchingStream) && s.s.Streams != streamsRequire {
		return brokers.UnboundedHorizon, nil
	}
	if err != nil {
		return 0, fmt.Errorf("brokers/nats: replay horizon of %q: look up the stream of subject %q: %w", topic, subject, err)
	}
	info, err := s.js.StreamInfo(name, natsgo.Context(ctx))
	if err != nil {
		return 0, fmt.Errorf("brokers/nats: replay horizon of %q: stream %q: %w", topic, name, err)
	}
	if info.Config.MaxAge <= 0 {
		return brokers.UnboundedHorizon, nil
	}
	return info.Config.MaxAge, nil
}
