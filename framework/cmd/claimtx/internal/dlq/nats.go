package dlq

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/claimtx/claimtx/brokers"
	_ "github.com/claimtx/claimtx/brokers/nats" // registers the kind
	"github.com/claimtx/claimtx/internal/natsmsg"
	"github.com/claimtx/claimtx/internal/poison"
)

// natsSource browses the poison subject's stream by sequence (get-message:
// no consumer is created, so a killed browse leaves nothing behind) and
// deletes a letter's sequence once its copy was acknowledged.
type natsSource struct {
	nc      *natsgo.Conn
	js      jetstream.JetStream
	stream  jetstream.Stream
	topic   string
	prefix  string
	subject string
	next    uint64 // next sequence to read
	last    uint64 // the stream's last sequence at the opening
	total   int64
	read    int64
	targets map[string]error
}

func openNATS(ctx context.Context, cfg brokers.NATSConfig, o Options) (_ *natsSource, err error) {
	opts := append([]natsgo.Option{natsgo.Name("claimtx-dlq")}, natsmsg.Auth(cfg.User, cfg.Password, cfg.Token, cfg.CredsFile)...)
	nc, err := natsgo.Connect(cmp.Or(cfg.URL, natsgo.DefaultURL), opts...)
	if err != nil {
		return nil, fmt.Errorf("connect to NATS: %w", err)
	}
	s := &natsSource{nc: nc, topic: o.Destination, prefix: cfg.SubjectPrefix, subject: cfg.SubjectPrefix + o.Destination, targets: map[string]error{}}
	defer func() {
		if err != nil {
			_ = s.Close()
		}
	}()
	if s.js, err = jetstream.New(nc); err != nil {
		return nil, fmt.Errorf("JetStream: %w", err)
	}
	octx, cancel := context.WithTimeout(ctx, openTimeout)
	defer cancel()
	if s.stream, err = s.streamOf(octx, "poison", s.subject); err != nil {
		return nil, err
	}
	info, err := s.stream.Info(octx, jetstream.WithSubjectFilter(s.subject))
	if err != nil {
		return nil, fmt.Errorf("read the poison stream of %q: %w", s.subject, err)
	}
	s.total = int64(info.State.Subjects[s.subject])
	s.next, s.last = max(info.State.FirstSeq, 1), info.State.LastSeq
	return s, nil
}

// streamOf is the stream capturing subject: a publish to a subject no
// stream captures gets no acknowledgement, only a timeout.
func (s *natsSource) streamOf(ctx context.Context, what, subject string) (jetstream.Stream, error) {
	name, err := s.js.StreamNameBySubject(ctx, subject)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, fmt.Errorf("%s subject %q does not exist on NATS: no stream captures it (check --topic, --poison-topic and NATS_SUBJECT_PREFIX)", what, subject)
	}
	if err != nil {
		return nil, fmt.Errorf("look up the stream of the %s subject %q: %w", what, subject, err)
	}
	st, err := s.js.Stream(ctx, name)
	if err != nil {
		return nil, fmt.Errorf("stream %q of the %s subject %q: %w", name, what, subject, err)
	}
	return st, nil
}

func (s *natsSource) Destination() string { return s.topic }
func (s *natsSource) Total() int64        { return s.total }

func (s *natsSource) Next(ctx context.Context, limit int) ([]*Letter, error) {
	var out []*Letter
	for len(out) < limit && s.read < s.total && s.next <= s.last {
		m, err := s.stream.GetMsg(ctx, s.next, jetstream.WithGetMsgSubject(s.subject))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			// Removed meanwhile (another replay, a limit): stop here.
			s.total = s.read
			break
		}
		if err != nil {
			return out, fmt.Errorf("read the poison stream of %q at sequence %d: %w", s.subject, s.next, err)
		}
		if m.Sequence > s.last {
			s.total = s.read // poisoned after the opening: the next run's
			break
		}
		s.next = m.Sequence + 1
		s.read++
		msg := natsmsg.Message(m.Subject, m.Header, m.Data, &natsmsg.Stored{Stream: s.stream.CachedInfo().Config.Name, Sequence: m.Sequence, Time: m.Time})
		out = append(out, &Letter{Msg: msg, Position: "#" + strconv.FormatUint(m.Sequence, 10), Stamps: stampsOf(msg.Metadata), raw: m})
	}
	return page(out)
}

func (s *natsSource) Settle(ctx context.Context, batch []*Letter, target func(*Letter) string) error {
	return republish(batch, target, func(l *Letter, topic string) (func() error, error) {
		subject := s.prefix + topic
		if err := checkOnce(s.targets, subject, func() error {
			_, err := s.streamOf(ctx, "original topic's", subject)
			return err
		}); err != nil {
			return nil, err
		}
		f, err := s.js.PublishMsgAsync(republished(l.raw.(*jetstream.RawStreamMsg), subject))
		if err != nil {
			return nil, fmt.Errorf("republish %s to %q: %w", l.Position, subject, err)
		}
		return func() error {
			select {
			case ack := <-f.Ok():
				if ack.Duplicate {
					// The stream dropped it: a message with its Nats-Msg-Id came
					// within the stream's duplicate window. Keep the letter.
					return fmt.Errorf("JetStream dropped the copy of %s as a duplicate of Nats-Msg-Id %q (the stream's duplicate window): it stays in the poison stream, replay it later",
						l.Position, f.Msg().Header.Get(natsgo.MsgIdHdr))
				}
				return nil
			case err := <-f.Err():
				return fmt.Errorf("republish %s: %w", l.Position, err)
			case <-ctx.Done():
				return fmt.Errorf("await the acknowledgement of %s: %w", l.Position, ctx.Err())
			}
		}, nil
	}, func(l *Letter) error {
		if err := s.stream.DeleteMsg(ctx, l.raw.(*jetstream.RawStreamMsg).Sequence); err != nil {
			return fmt.Errorf("remove %s from the poison stream: %w", l.Position, err)
		}
		return nil
	})
}

func (s *natsSource) Close() error {
	if s.nc != nil {
		s.nc.Close()
	}
	return nil
}

// republished is the copy of m that goes back to subject: data and
// headers (UUID and Nats-Msg-Id included) without the poison bookkeeping
// and JetStream's publish preconditions.
func republished(m *jetstream.RawStreamMsg, subject string) *natsgo.Msg {
	hdr := make(natsgo.Header, len(m.Header))
	for k, vs := range m.Header {
		if !poison.IsPoisonKey(k) && !strings.HasPrefix(k, natsmsg.ExpectedPrefix) {
			hdr[k] = vs
		}
	}
	return &natsgo.Msg{Subject: subject, Header: hdr, Data: m.Data}
}
