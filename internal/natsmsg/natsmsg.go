// Package natsmsg is what brokers/nats and the dead-letter tooling (which
// reads poison streams with nats.go directly) share: how a JetStream
// message becomes a Watermill message, so a key spec sees the same one,
// and how a client authenticates.
package natsmsg

import (
	"cmp"
	"strconv"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wmnats "github.com/ThreeDotsLabs/watermill-nats/v2/pkg/nats"
	"github.com/ThreeDotsLabs/watermill/message"
	natsgo "github.com/nats-io/nats.go"
)

// Metadata keys set from where JetStream stored a message: they describe
// one copy, so they are never published and make no claim key.
const (
	MetaPrefix    = "nats_"
	MetaSubject   = "nats_subject"   // the subject the message was published to
	MetaStream    = "nats_stream"    // the stream that stored it
	MetaSequence  = "nats_sequence"  // its sequence number in that stream
	MetaDelivered = "nats_delivered" // 1 on the first delivery, then 2, 3, ...
	MetaTimestamp = "nats_timestamp" // when the stream stored it, RFC 3339 (UTC)
)

// ExpectedPrefix starts JetStream's publish preconditions
// (Nats-Expected-Stream, ...), which would make a republished copy fail.
const ExpectedPrefix = "Nats-Expected-"

// Stored is where JetStream keeps a message. Delivered is 0 for a message
// read by sequence (a browse), which delivers nothing.
type Stored struct {
	Stream    string
	Sequence  uint64
	Delivered uint64
	Time      time.Time
}

// Message is a NATS message as the adapter hands it to a consumer: headers
// as metadata (several values joined with ", ", as HTTP does), the UUID
// from watermill-nats's header, else the Nats-Msg-Id, else a new one, and
// the nats_ keys from subject and at (nil: the subject only).
func Message(subject string, hdr natsgo.Header, data []byte, at *Stored) *message.Message {
	md := make(message.Metadata, len(hdr)+5)
	for k, vs := range hdr {
		if k == wmnats.WatermillUUIDHdr || strings.HasPrefix(k, ExpectedPrefix) {
			continue
		}
		md.Set(k, strings.Join(vs, ", "))
	}
	// Nats-Msg-Id: a plain producer's deduplication id.
	id := cmp.Or(hdr.Get(wmnats.WatermillUUIDHdr), hdr.Get(natsgo.MsgIdHdr), watermill.NewUUID())
	md.Set(MetaSubject, subject)
	if at != nil {
		md.Set(MetaStream, at.Stream)
		md.Set(MetaSequence, strconv.FormatUint(at.Sequence, 10))
		if at.Delivered > 0 {
			md.Set(MetaDelivered, strconv.FormatUint(at.Delivered, 10))
		}
		md.Set(MetaTimestamp, at.Time.UTC().Format(time.RFC3339Nano))
	}
	msg := message.NewMessage(id, data)
	msg.Metadata = md
	return msg
}

// Auth is how a client authenticates (brokers.NATSConfig's fields, passed
// one by one so that this package stays below brokers).
func Auth(user, password, token, credsFile string) []natsgo.Option {
	var opts []natsgo.Option
	switch {
	case user != "":
		opts = append(opts, natsgo.UserInfo(user, password))
	case token != "":
		opts = append(opts, natsgo.Token(token))
	}
	if credsFile != "" {
		opts = append(opts, natsgo.UserCredentials(credsFile))
	}
	return opts
}
