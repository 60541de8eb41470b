package dlq

import (
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"hash/fnv"
	"maps"
	"os"
	"slices"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/claimtx/claimtx/brokers"
	_ "github.com/claimtx/claimtx/brokers/kafka" // registers the kind
	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/internal/kafkarecord"
	"github.com/claimtx/claimtx/internal/poison"
)

const (
	// kafkaIdle: a partition short of its opening end offset that sends
	// nothing for this long has a gap (compaction, transaction markers).
	kafkaIdle = 10 * time.Second
	// openTimeout bounds the opening: a client that reaches no broker
	// retries forever otherwise.
	openTimeout = 30 * time.Second
)

// kafkaSource browses a topic outside any consumer group and records the
// replay progress as the committed offsets of ProgressGroup.
type kafkaSource struct {
	cl    *kgo.Client // metadata, offsets, produce
	adm   *kadm.Client
	cons  *kgo.Client // reads the destination
	topic string
	group string
	end   map[int32]int64 // end offsets at the opening
	next  map[int32]int64 // next offset to read
	// progress: every message below it was republished or passed over for
	// good; a blocked partition has a message kept for later.
	committed map[int32]int64
	progress  map[int32]int64
	blocked   map[int32]bool
	total     int64
	targets   map[string]error
}

// kgoOptions maps the Kafka adapter's connection settings onto franz-go.
func kgoOptions(c brokers.KafkaConfig) ([]kgo.Opt, error) {
	addrs := c.Brokers
	if len(addrs) == 0 {
		addrs = []string{"127.0.0.1:9092"}
	}
	opts := []kgo.Opt{kgo.SeedBrokers(addrs...), kgo.ClientID(cmp.Or(c.ClientID, "claimtx") + "-dlq")}
	if c.TLS.Enabled {
		tc := &tls.Config{
			MinVersion:         tls.VersionTLS12,
			ServerName:         c.TLS.ServerName,
			InsecureSkipVerify: c.TLS.InsecureSkipVerify, //nolint:gosec // opt-in, documented as unsafe on kafka.TLSConfig
		}
		if c.TLS.CAFile != "" {
			pem, err := os.ReadFile(c.TLS.CAFile)
			if err != nil {
				return nil, &framework.ConfigError{Field: "kafka.tls.ca_file", Reason: "cannot be read", Err: err}
			}
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(pem) {
				return nil, &framework.ConfigError{Field: "kafka.tls.ca_file", Reason: "holds no PEM certificate"}
			}
			tc.RootCAs = pool
		}
		if c.TLS.CertFile != "" {
			cert, err := tls.LoadX509KeyPair(c.TLS.CertFile, c.TLS.KeyFile)
			if err != nil {
				return nil, &framework.ConfigError{Field: "kafka.tls.cert_file", Reason: "cannot load the client certificate and key", Err: err}
			}
			tc.Certificates = []tls.Certificate{cert}
		}
		opts = append(opts, kgo.DialTLSConfig(tc))
	}
	switch c.SASL.Mechanism {
	case "":
	case "PLAIN":
		opts = append(opts, kgo.SASL(plain.Auth{User: c.SASL.User, Pass: c.SASL.Password}.AsMechanism()))
	case "SCRAM-SHA-256":
		opts = append(opts, kgo.SASL(scram.Auth{User: c.SASL.User, Pass: c.SASL.Password}.AsSha256Mechanism()))
	case "SCRAM-SHA-512":
		opts = append(opts, kgo.SASL(scram.Auth{User: c.SASL.User, Pass: c.SASL.Password}.AsSha512Mechanism()))
	default:
		return nil, &framework.ConfigError{Field: "kafka.sasl.mechanism", Reason: fmt.Sprintf("%q is not supported", c.SASL.Mechanism)}
	}
	return opts, nil
}

// fnv32a is Sarama's key hash: a republished record lands on the partition
// claimtx's publisher (Sarama) would choose.
func fnv32a(b []byte) uint32 {
	h := fnv.New32a()
	_, _ = h.Write(b)
	return h.Sum32()
}

func openKafka(ctx context.Context, cfg brokers.KafkaConfig, o Options) (_ *kafkaSource, err error) {
	base, err := kgoOptions(cfg)
	if err != nil {
		return nil, err
	}
	cl, err := kgo.NewClient(append(base,
		kgo.RecordPartitioner(kgo.StickyKeyPartitioner(kgo.SaramaCompatHasher(fnv32a))),
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.ProducerLinger(0),
	)...)
	if err != nil {
		return nil, &framework.ConfigError{Field: "kafka", Reason: "rejected by franz-go", Err: err}
	}
	s := &kafkaSource{cl: cl, adm: kadm.NewClient(cl), topic: o.Destination, end: map[int32]int64{}, next: map[int32]int64{},
		committed: map[int32]int64{}, progress: map[int32]int64{}, blocked: map[int32]bool{}, targets: map[string]error{}}
	if o.Consumer != "" {
		s.group = ProgressGroup(o.Consumer)
	}
	defer func() {
		if err != nil {
			_ = s.Close()
		}
	}()
	octx, cancel := context.WithTimeout(ctx, openTimeout)
	defer cancel()
	if err := s.topicExists(octx, "poison topic", s.topic); err != nil {
		return nil, err
	}
	starts, err := s.adm.ListStartOffsets(octx, s.topic)
	if err = cmp.Or(err, starts.Error()); err != nil {
		return nil, fmt.Errorf("list the start offsets of %q: %w", s.topic, err)
	}
	ends, err := s.adm.ListEndOffsets(octx, s.topic)
	if err = cmp.Or(err, ends.Error()); err != nil {
		return nil, fmt.Errorf("list the end offsets of %q: %w", s.topic, err)
	}
	if s.group != "" {
		// GroupIDNotFound: no replay yet (kfake says so; Kafka returns no offsets).
		resps, err := s.adm.FetchOffsetsForTopics(octx, s.group, s.topic)
		if err != nil && !errors.Is(err, kerr.GroupIDNotFound) {
			return nil, fmt.Errorf("read the replay progress (consumer group %q): %w", s.group, err)
		}
		resps.Each(func(r kadm.OffsetResponse) {
			if r.Err == nil && r.Topic == s.topic && r.At >= 0 {
				s.committed[r.Partition] = r.At
			}
		})
	}
	consume := map[int32]kgo.Offset{}
	starts.Each(func(lo kadm.ListedOffset) {
		start := lo.Offset
		c, ok := s.committed[lo.Partition]
		if ok {
			s.progress[lo.Partition] = c
			if o.Resume {
				start = max(start, c)
			}
		}
		end, _ := ends.Lookup(s.topic, lo.Partition)
		s.end[lo.Partition], s.next[lo.Partition] = end.Offset, start
		if start < end.Offset {
			s.total += end.Offset - start
			consume[lo.Partition] = kgo.NewOffset().At(start)
		}
	})
	if len(consume) > 0 {
		s.cons, err = kgo.NewClient(append(base,
			kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{s.topic: consume}),
			kgo.FetchMaxWait(200*time.Millisecond),
		)...)
		if err != nil {
			return nil, &framework.ConfigError{Field: "kafka", Reason: "rejected by franz-go", Err: err}
		}
	}
	return s, nil
}

// topicExists reports a missing topic as such, without creating it.
func (s *kafkaSource) topicExists(ctx context.Context, what, topic string) error {
	td, err := s.adm.ListTopics(ctx, topic)
	if err != nil {
		return fmt.Errorf("look up %s %q: %w", what, topic, err)
	}
	d, ok := td[topic]
	if !ok || errors.Is(d.Err, kerr.UnknownTopicOrPartition) {
		return fmt.Errorf("%s %q does not exist on Kafka (check --topic and --poison-topic)", what, topic)
	}
	if d.Err != nil {
		return fmt.Errorf("look up %s %q: %w", what, topic, d.Err)
	}
	return nil
}

func (s *kafkaSource) Destination() string { return s.topic }
func (s *kafkaSource) Total() int64        { return s.total }

// done reports whether every partition was read to its end offset.
func (s *kafkaSource) done() bool {
	for p, end := range s.end {
		if s.next[p] < end {
			return false
		}
	}
	return true
}

func (s *kafkaSource) Next(ctx context.Context, limit int) ([]*Letter, error) {
	var out []*Letter
	for len(out) < limit && !s.done() {
		pctx, cancel := context.WithTimeout(ctx, kafkaIdle)
		fs := s.cons.PollRecords(pctx, limit-len(out))
		timedOut := pctx.Err() != nil
		cancel()
		if err := ctx.Err(); err != nil {
			return out, err
		}
		var errs []error
		fs.EachError(func(t string, p int32, err error) {
			if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
				errs = append(errs, fmt.Errorf("read %s partition %d: %w", t, p, err))
			}
		})
		if len(errs) > 0 {
			return out, errors.Join(errs...)
		}
		got := 0
		fs.EachRecord(func(r *kgo.Record) {
			if r.Offset < s.next[r.Partition] || r.Offset >= s.end[r.Partition] {
				return // produced after the opening: the next run's
			}
			got++
			s.next[r.Partition] = r.Offset + 1
			out = append(out, s.letter(r))
		})
		var finished []int32
		for p, end := range s.end {
			if s.next[p] >= end {
				finished = append(finished, p)
			}
		}
		s.cons.PauseFetchPartitions(map[string][]int32{s.topic: finished})
		if got == 0 && timedOut {
			// Nothing more comes below the end offsets: gaps.
			for p, end := range s.end {
				s.next[p] = max(s.next[p], end)
			}
		}
	}
	return page(out)
}

// letter is r as claimtx's Kafka adapter hands it to a consumer.
func (s *kafkaSource) letter(r *kgo.Record) *Letter {
	msg := kafkarecord.KafkaMessage(r.Topic, r.Partition, r.Offset, r.Key, r.Value, r.Timestamp, r.Headers,
		func(h kgo.RecordHeader) (string, []byte, bool) { return h.Key, h.Value, true })
	c, ok := s.committed[r.Partition]
	return &Letter{
		Msg: msg, Position: fmt.Sprintf("%d@%d", r.Partition, r.Offset), Partition: r.Partition, Offset: r.Offset,
		Handled: ok && r.Offset < c, Stamps: stampsOf(msg.Metadata), raw: r,
	}
}

func (s *kafkaSource) Settle(ctx context.Context, batch []*Letter, target func(*Letter) string) error {
	var recs []*kgo.Record
	var sent []*Letter
	var errs []error
	err := eachReplay(batch, target, func(l *Letter, t string) error {
		if err := checkOnce(s.targets, t, func() error { return s.topicExists(ctx, "original topic", t) }); err != nil {
			return err
		}
		r := l.raw.(*kgo.Record)
		nr := &kgo.Record{Topic: t, Key: r.Key, Value: r.Value, Timestamp: r.Timestamp}
		for _, h := range r.Headers {
			if !poison.IsPoisonKey(h.Key) {
				nr.Headers = append(nr.Headers, h)
			}
		}
		recs = append(recs, nr)
		sent = append(sent, l)
		return nil
	})
	if err != nil {
		errs = append(errs, err)
	}
	if len(recs) > 0 {
		for i, res := range s.cl.ProduceSync(ctx, recs...) {
			if res.Err != nil {
				errs = append(errs, fmt.Errorf("republish %s to %q: %w", sent[i].Position, recs[i].Topic, res.Err))
				continue
			}
			sent[i].Replayed = true
		}
	}
	if err := s.record(ctx, batch); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// record commits the replay progress over batch, per partition up to its
// first letter kept for later.
func (s *kafkaSource) record(ctx context.Context, batch []*Letter) error {
	if s.group == "" {
		return nil
	}
	moved := map[int32]bool{}
	for _, l := range batch {
		p := l.Partition
		if s.blocked[p] {
			continue
		}
		if l.Replayed || l.Action == ActionPass {
			if l.Offset+1 > s.progress[p] {
				s.progress[p] = l.Offset + 1
				moved[p] = true
			}
			continue
		}
		s.blocked[p] = true
	}
	if len(moved) == 0 {
		return nil
	}
	var offs kadm.Offsets
	for _, p := range slices.Sorted(maps.Keys(moved)) {
		offs.AddOffset(s.topic, p, s.progress[p], -1)
	}
	resps, err := s.adm.CommitOffsets(ctx, s.group, offs)
	if err = cmp.Or(err, resps.Error()); err != nil {
		return fmt.Errorf("record the replay progress (consumer group %q): %w", s.group, err)
	}
	return nil
}

func (s *kafkaSource) Close() error {
	if s.cons != nil {
		s.cons.Close()
	}
	if s.cl != nil {
		s.cl.Close()
	}
	return nil
}
