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
// still delivers it: the max_age of the stream that captures its subject,
// or brokers.UnboundedHorizon when it has none (JetStream's default, and
// the streams the adapter creates). Limits by count or size (max_msgs,
// max_bytes, max_msgs_per_subject) and the interest and work-queue
// retention policies only remove messages sooner, so they never lengthen
// the horizon and are not part of it. A subject no stream captures yet
// reports what streams: create will give it, unbounded. A consumer
// compares the horizon with its claim retention (framework/consumer's
// Config.Retention).
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
