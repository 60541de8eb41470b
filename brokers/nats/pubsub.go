package nats

import (
	"context"
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

// publisher is watermill-nats's JetStream publisher (a PubAck per message)
// with each topic's stream ensured before its first publish.
type publisher struct {
	s       settings
	js      natsgo.JetStreamContext
	pub     *wmnats.Publisher
	streams sync.Map // subject -> struct{}: its stream exists
	denied  *deniedSubjects
}

func newPublisher(ctx context.Context, s settings, logger watermill.LoggerAdapter) (*publisher, error) {
	denied := &deniedSubjects{}
	nc, js, err := dial(ctx, s, logger, "publisher", denied)
	if err != nil {
		return nil, err
	}
	pub, err := wmnats.NewPublisherWithNatsConn(nc, wmnats.PublisherPublishConfig{
		Marshaler:         marshaler{subjectPrefix: s.SubjectPrefix},
		SubjectCalculator: wmnats.DefaultSubjectCalculator, // required, unused: provisioning is off
		JetStream: wmnats.JetStreamConfig{
			// watermill-nats would name a stream after the topic, and
			// TOPIC.poison is no stream name: ensureStream does it.
			AutoProvision: false,
			// JetStream would drop a message whose UUID was reused.
			TrackMsgId: false,
		},
	}, logger)
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("brokers/nats: publisher: %w", err)
	}
	return &publisher{s: s, js: js, pub: pub, denied: denied}, nil
}

// Publish ensures the topic's stream, then publishes each message and waits
// for JetStream's acknowledgement. What will never be taken (see refused,
// no stream with streams: require, a permissions violation) is a
// framework.Permanent error.
func (p *publisher) Publish(topic string, msgs ...*message.Message) error {
	subject, err := p.s.subject(topic)
	if err != nil {
		return err
	}
	if _, ok := p.streams.Load(subject); !ok {
		if _, err := ensureStream(p.js, p.s, subject); err != nil {
			if errors.Is(err, errNoStream) {
				return framework.Permanent(err)
			}
			return err
		}
		p.streams.Store(subject, struct{}{})
	}
	start := time.Now()
	if err := p.pub.Publish(topic, msgs...); err != nil {
		if errors.Is(err, natsgo.ErrNoStreamResponse) || errors.Is(err, natsgo.ErrNoResponders) {
			p.streams.Delete(subject)
		}
		err = fmt.Errorf("brokers/nats: publish to %q: %w", subject, err)
		if p.denied.since(subject, start) {
			// The timeout waiting for JetStream's ack is this refusal.
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

// refused reports whether a publish failed because of the message itself:
// over max_payload or the stream's limits, headers over 64 KiB, a metadata
// key that cannot be a header.
func refused(err error) bool {
	var api *natsgo.APIError
	return errors.Is(err, natsgo.ErrMaxPayload) || errors.Is(err, errHeaderKey) ||
		errors.As(err, &api) && (api.ErrorCode == jsErrMessageTooLarge || api.ErrorCode == jsErrHeaderTooLarge)
}

func (p *publisher) Close() error {
	return p.pub.Close()
}
