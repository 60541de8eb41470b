package nats

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wmnats "github.com/ThreeDotsLabs/watermill-nats/v2/pkg/nats"
	"github.com/ThreeDotsLabs/watermill/message"
	natsgo "github.com/nats-io/nats.go"

	"github.com/claimtx/claimtx/framework"
)

// publisher is watermill-nats's JetStream publisher (Publish returns once
// JetStream stored the message: a PubAck per message) with the stream of
// each topic ensured before its first publish, so a message published
// before any consumer subscribed is kept, and the poison topic gets a
// stream of its own.
type publisher struct {
	s       settings
	nc      *natsgo.Conn
	js      natsgo.JetStreamContext
	pub     *wmnats.Publisher
	streams sync.Map // subject -> struct{}: its stream exists
	denied  *deniedSubjects
}

func newPublisher(s settings, logger watermill.LoggerAdapter) (*publisher, error) {
	denied := &deniedSubjects{}
	nc, js, err := dial(s, logger, "publisher", denied)
	if err != nil {
		return nil, err
	}
	pub, err := wmnats.NewPublisherWithNatsConn(nc, wmnats.PublisherPublishConfig{
		Marshaler:         marshaler{subjectPrefix: s.SubjectPrefix},
		SubjectCalculator: subjectCalculator(s),
		JetStream: wmnats.JetStreamConfig{
			// Streams are ensured here (ensureStream), not by
			// watermill-nats, which would name a stream after the
			// topic, and a topic with a '.' (TOPIC.poison) is not a
			// stream name.
			AutoProvision: false,
			// No Nats-Msg-Id from the Watermill UUID: JetStream would
			// drop, for two minutes, any message whose UUID a producer
			// reused, and claimtx does not need the broker to deduplicate.
			TrackMsgId: false,
		},
	}, logger)
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("brokers/nats: publisher: %w", err)
	}
	return &publisher{s: s, nc: nc, js: js, pub: pub, denied: denied}, nil
}

// Publish ensures the topic's stream, then publishes each message and waits
// for JetStream's acknowledgement. What JetStream or the server will never
// take is a framework.Permanent error (see refused): a message over the
// server's max_payload or a stream's limits, headers over JetStream's
// 64 KiB, a metadata key no header can carry, no stream with streams:
// require.
func (p *publisher) Publish(topic string, msgs ...*message.Message) error {
	subject, err := p.s.subject(topic)
	if err != nil {
		return err
	}
	if _, ok := p.streams.Load(subject); !ok {
		if _, err := ensureStream(p.js, p.s, subject); err != nil {
			if errors.Is(err, errNoStream) {
				// An operator's to create: until then no publish to
				// it can succeed.
				return framework.Permanent(err)
			}
			return err
		}
		p.streams.Store(subject, struct{}{})
	}
	start := time.Now()
	if err := p.pub.Publish(topic, msgs...); err != nil {
		if errors.Is(err, natsgo.ErrNoStreamResponse) || errors.Is(err, natsgo.ErrNoResponders) {
			// The stream was deleted since: ensure it again next time.
			p.streams.Delete(subject)
		}
		err = fmt.Errorf("brokers/nats: publish to %q: %w", subject, err)
		if p.denied.since(subject, start) {
			// The server refused the publish (permissions): the
			// timeout waiting for JetStream's acknowledgement is that.
			return framework.Permanent(fmt.Errorf("%w (the server refused it: permissions violation for publish to %q)", err, subject))
		}
		if refused(err) {
			return framework.Permanent(err)
		}
		return err
	}
	return nil
}

// JetStream's API error codes for a message it will never store as it is.
const (
	jsErrMessageTooLarge = 10054 // JSStreamMessageExceedsMaximumErr: over the stream's max_msg_size
	jsErrHeaderTooLarge  = 10097 // JSStreamHeaderExceedsMaximumErr: headers over 64 KiB
)

// refused reports whether a publish failed because of the message itself,
// so that publishing it again cannot succeed: over the server's
// max_payload (nats.go checks before sending), too large for JetStream, or
// a metadata key that cannot be a header. Anything else (no connection, a
// timeout, a stream being recreated) may pass on a later attempt.
func refused(err error) bool {
	if errors.Is(err, natsgo.ErrMaxPayload) || errors.Is(err, errHeaderKey) {
		return true
	}
	var api *natsgo.APIError
	if errors.As(err, &api) {
		switch api.ErrorCode {
		case jsErrMessageTooLarge, jsErrHeaderTooLarge:
			return true
		}
	}
	return false
}

// Close closes the connection.
func (p *publisher) Close() error {
	return p.pub.Close()
}

// subjectCalculator maps a topic to its subject, for watermill-nats's
// publisher (its stream provisioning, which is off).
func subjectCalculator(s settings) wmnats.SubjectCalculator {
	return func(string, topic string) *wmnats.SubjectDetail {
		return &wmnats.SubjectDetail{Primary: s.SubjectPrefix + topic}
	}
}
