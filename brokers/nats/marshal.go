package nats

import (
	"errors"
	"fmt"
	"strings"

	wmnats "github.com/ThreeDotsLabs/watermill-nats/v2/pkg/nats"
	"github.com/ThreeDotsLabs/watermill/message"
	natsgo "github.com/nats-io/nats.go"

	"github.com/claimtx/claimtx/internal/natsmsg"
)

// Metadata keys the subscriber sets from the JetStream delivery (see
// natsmsg: the dead-letter tooling sets them too).
const (
	metaPrefix    = natsmsg.MetaPrefix
	metaDelivered = natsmsg.MetaDelivered
)

// errHeaderKey is wrapped when a metadata key cannot be a NATS header.
var errHeaderKey = errors.New("cannot be a NATS header (letters, digits and !#$%&'*+-.^_`|~ only)")

// marshaler converts Watermill messages to NATS messages and back.
//
// Publishing, the subject is the subject prefix plus the topic (watermill-nats
// uses the bare topic); metadata becomes headers, except the nats_ keys and
// JetStream's Nats-Expected-* publish preconditions, which would make a
// republished copy fail (or be refused by the poison stream). The
// Watermill UUID travels in watermill-nats's _watermill_message_uuid
// header, so watermill-nats subscribers read these messages too.
//
// Consuming, it never fails: watermill-nats drops a message its
// Unmarshaler refuses without acking or nacking it, so JetStream would
// redeliver it after every AckWait, forever, and it would never reach the
// poison topic. natsmsg.Message says how headers become metadata.
type marshaler struct {
	subjectPrefix string
}

var _ wmnats.MarshalerUnmarshaler = marshaler{}

// Marshal implements watermill-nats's Marshaler.
func (m marshaler) Marshal(topic string, msg *message.Message) (*natsgo.Msg, error) {
	hdr := make(natsgo.Header, len(msg.Metadata)+1)
	for k, v := range msg.Metadata {
		if strings.HasPrefix(k, metaPrefix) || strings.HasPrefix(k, natsmsg.ExpectedPrefix) || k == wmnats.WatermillUUIDHdr {
			continue
		}
		if !validHeaderKey(k) {
			// nats.go writes headers with net/http, which drops such a
			// key without a word: refuse instead of losing it.
			return nil, fmt.Errorf("brokers/nats: metadata key %q %w", k, errHeaderKey)
		}
		hdr.Set(k, v)
	}
	hdr.Set(wmnats.WatermillUUIDHdr, msg.UUID)
	return &natsgo.Msg{Subject: m.subjectPrefix + topic, Data: msg.Payload, Header: hdr}, nil
}

// Unmarshal implements watermill-nats's Unmarshaler; it never fails (see
// marshaler).
func (m marshaler) Unmarshal(nm *natsgo.Msg) (*message.Message, error) {
	var at *natsmsg.Stored
	if meta, err := nm.Metadata(); err == nil {
		at = &natsmsg.Stored{Stream: meta.Stream, Sequence: meta.Sequence.Stream, Delivered: meta.NumDelivered, Time: meta.Timestamp}
	}
	return natsmsg.Message(nm.Subject, nm.Header, nm.Data, at), nil
}

// validHeaderKey reports whether k is an HTTP token, which is what
// nats.go's header writer (net/http's) keeps.
func validHeaderKey(k string) bool {
	if k == "" {
		return false
	}
	for i := 0; i < len(k); i++ {
		c := k[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}
