package nats

import (
	"errors"
	"fmt"
	"regexp"

	natsgo "github.com/nats-io/nats.go"
)

// streamNameUnsafe is what a stream name cannot hold ('.', '*', '>',
// whitespace, path separators), widened to anything but a plain name:
// "order-completed.poison" -> stream "order-completed_poison".
var streamNameUnsafe = regexp.MustCompile(`[^A-Za-z0-9_-]`)

var errNoStream = errors.New("no JetStream stream captures the subject")

// ensureStream returns the stream that captures subject, creating one as
// the package documentation says ("Subjects and streams").
func ensureStream(js natsgo.JetStreamContext, s settings, subject string) (string, error) {
	name, err := js.StreamNameBySubject(subject)
	if err == nil {
		return name, nil
	}
	if !errors.Is(err, natsgo.ErrNoMatchingStream) {
		return "", fmt.Errorf("brokers/nats: look up the stream of subject %q: %w", subject, err)
	}
	if s.Streams == streamsRequire {
		return "", fmt.Errorf("brokers/nats: %w %q (nats.streams is %q: create the stream, or set it to %q)",
			errNoStream, subject, streamsRequire, "create")
	}
	name = streamNameUnsafe.ReplaceAllString(subject, "_")
	_, err = js.AddStream(&natsgo.StreamConfig{
		Name:        name,
		Description: "created by claimtx for subject " + subject,
		Subjects:    []string{subject},
		Storage:     natsgo.FileStorage,
		Retention:   natsgo.LimitsPolicy,
	})
	if err == nil {
		return name, nil
	}
	// A replica created it first, or the name captures other subjects.
	if again, lerr := js.StreamNameBySubject(subject); lerr == nil {
		return again, nil
	}
	return "", fmt.Errorf("brokers/nats: create stream %q for subject %q: %w", name, subject, err)
}

// ensureConsumer creates the durable consumer of subject on stream, or
// checks the existing one and updates its limits. Not the subscription:
// nats.go deletes a consumer its subscription created when it ends, under
// the other replicas.
func ensureConsumer(js natsgo.JetStreamContext, s settings, stream, subject string) error {
	want := &natsgo.ConsumerConfig{
		Durable:       s.Durable,
		Description:   "claimtx consumer of " + subject,
		FilterSubject: subject,
		DeliverPolicy: natsgo.DeliverAllPolicy,
		AckPolicy:     natsgo.AckExplicitPolicy,
		AckWait:       s.AckWait,
		MaxDeliver:    s.MaxDeliver,
		MaxAckPending: s.MaxAckPending,
		ReplayPolicy:  natsgo.ReplayInstantPolicy,
	}
	info, err := js.ConsumerInfo(stream, s.Durable)
	if errors.Is(err, natsgo.ErrConsumerNotFound) {
		if _, err = js.AddConsumer(stream, want); err == nil {
			return nil
		}
		// Created by a replica in between, perhaps with other limits.
		info, err = js.ConsumerInfo(stream, s.Durable)
	}
	if err != nil {
		return fmt.Errorf("brokers/nats: consumer %q on stream %q: %w", s.Durable, stream, err)
	}
	have := info.Config
	switch {
	case have.DeliverSubject != "":
		return fmt.Errorf("brokers/nats: consumer %q on stream %q exists and is a push consumer, not a pull consumer: delete it or choose another durable name", s.Durable, stream)
	case have.FilterSubject != "" && have.FilterSubject != subject:
		return fmt.Errorf("brokers/nats: consumer %q on stream %q filters subject %q, not %q: one durable name per topic", s.Durable, stream, have.FilterSubject, subject)
	case have.AckPolicy != natsgo.AckExplicitPolicy:
		return fmt.Errorf("brokers/nats: consumer %q on stream %q does not use explicit acks", s.Durable, stream)
	}
	if have.AckWait == want.AckWait && have.MaxDeliver == want.MaxDeliver && have.MaxAckPending == want.MaxAckPending {
		return nil
	}
	have.AckWait, have.MaxDeliver, have.MaxAckPending = want.AckWait, want.MaxDeliver, want.MaxAckPending
	if _, err := js.UpdateConsumer(stream, &have); err != nil {
		return fmt.Errorf("brokers/nats: update consumer %q on stream %q: %w", s.Durable, stream, err)
	}
	return nil
}
