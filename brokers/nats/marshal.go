package nats

import (
	"errors"
	"fmt"
	"regexp"
	"strings"

	wmnats "github.com/ThreeDotsLabs/watermill-nats/v2/pkg/nats"
	"github.com/ThreeDotsLabs/watermill/message"
	natsgo "github.com/nats-io/nats.go"

	"github.com/claimtx/claimtx/internal/natsmsg"
)

// headerKey matches an HTTP token.
var headerKey = regexp.MustCompile("^[-A-Za-z0-9!#$%&'*+.^_`|~]+$")

var errHeaderKey = errors.New("cannot be a NATS header (letters, digits and !#$%&'*+-.^_`|~ only)")

// marshaler converts Watermill messages to NATS messages and back, in
// watermill-nats's format but with the subject prefix (package
// documentation, "Metadata"). Unmarshal never fails: a message it refused
// would come back every AckWait and never reach the poison topic.
type marshaler struct {
	subjectPrefix string
}

var _ wmnats.MarshalerUnmarshaler = marshaler{}

func (m marshaler) Marshal(topic string, msg *message.Message) (*natsgo.Msg, error) {
	hdr := make(natsgo.Header, len(msg.Metadata)+1)
	for k, v := range msg.Metadata {
		if strings.HasPrefix(k, natsmsg.MetaPrefix) || strings.HasPrefix(k, natsmsg.ExpectedPrefix) || k == wmnats.WatermillUUIDHdr {
			continue
		}
		if !headerKey.MatchString(k) {
			// net/http's header writer would drop it without a word.
			return nil, fmt.Errorf("brokers/nats: metadata key %q %w", k, errHeaderKey)
		}
		hdr.Set(k, v)
	}
	hdr.Set(wmnats.WatermillUUIDHdr, msg.UUID)
	return &natsgo.Msg{Subject: m.subjectPrefix + topic, Data: msg.Payload, Header: hdr}, nil
}

func (m marshaler) Unmarshal(nm *natsgo.Msg) (*message.Message, error) {
	var at *natsmsg.Stored
	if meta, err := nm.Metadata(); err == nil {
		at = &natsmsg.Stored{Stream: meta.Stream, Sequence: meta.Sequence.Stream, Delivered: meta.NumDelivered, Time: meta.Timestamp}
	}
	return natsmsg.Message(nm.Subject, nm.Header, nm.Data, at), nil
}
