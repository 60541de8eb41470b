package nats

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wmnats "github.com/ThreeDotsLabs/watermill-nats/v2/pkg/nats"
	"github.com/ThreeDotsLabs/watermill/message"
	natsgo "github.com/nats-io/nats.go"
)

// Metadata keys the subscriber sets from the JetStream delivery. They
// describe one delivery, so the publisher never sends them as headers
// (a poison copy does not carry the original's sequence), and none makes
// a claim key: they change when a message is published again.
const (
	metaPrefix    = "nats_"
	metaSubject   = "nats_subject"   // the subject the message was published to
	metaStream    = "nats_stream"    // the stream that stored it
	metaSequence  = "nats_sequence"  // its sequence number in that stream
	metaDelivered = "nats_delivered" // 1 on the first delivery, then 2, 3, ...
	metaTimestamp = "nats_timestamp" // when the stream stored it, RFC 3339 (UTC)
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
// poison topic. A header with several values (NATS allows it, Watermill
// metadata does not) becomes one value, joined with ", " as HTTP does.
type marshaler struct {
	subjectPrefix string
}

var _ wmnats.MarshalerUnmarshaler = marshaler{}

// Marshal implements watermill-nats's Marshaler.
func (m marshaler) Marshal(topic string, msg *message.Message) (*natsgo.Msg, error) {
	hdr := make(natsgo.Header, len(msg.Metadata)+1)
	for k, v := range msg.Metadata {
		if strings.HasPrefix(k, metaPrefix) || strings.HasPrefix(k, "Nats-Expected-") || k == wmnats.WatermillUUIDHdr {
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
	md := make(message.Metadata, len(nm.Header)+5)
	for k, vs := range nm.Header {
		if k == wmnats.WatermillUUIDHdr || strings.HasPrefix(k, "Nats-Expected-") {
			continue
		}
		md.Set(k, strings.Join(vs, ", "))
	}
	id := nm.Header.Get(wmnats.WatermillUUIDHdr)
	if id == "" {
		id = nm.Header.Get(natsgo.MsgIdHdr) // a plain producer's deduplication id
	}
	if id == "" {
		id = watermill.NewUUID() // the UUID is for logs; claims never use it
	}
	md.Set(metaSubject, nm.Subject)
	if meta, err := nm.Metadata(); err == nil {
		md.Set(metaStream, meta.Stream)
		md.Set(metaSequence, strconv.FormatUint(meta.Sequence.Stream, 10))
		md.Set(metaDelivered, strconv.FormatUint(meta.NumDelivered, 10))
		md.Set(metaTimestamp, meta.Timestamp.UTC().Format(time.RFC3339Nano))
	}
	msg := message.NewMessage(id, nm.Data)
	msg.Metadata = md
	return msg, nil
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
