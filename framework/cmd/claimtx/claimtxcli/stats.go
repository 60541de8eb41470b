package claimtxcli

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/claimtx/claimtx/brokers"
	"github.com/claimtx/claimtx/framework/cmd/claimtx/internal/opfmt"
	"github.com/claimtx/claimtx/framework/internal/replay"
	"github.com/claimtx/claimtx/internal/kafkarecord"
	"github.com/claimtx/claimtx/internal/pg"
	"github.com/claimtx/claimtx/store"
)

func init() {
	synopses["stats"] = "Claims per consumer, table and index size; with --topic and --retention, the claims' retention against the broker's replay horizon."
}

func cmdStats(ctx context.Context, args []string, stdout, _ io.Writer, getenv env, _ Config) error {
	fs, c := newFlags("stats", stdout, getenv)
	asJSON := fs.Bool("json", false, "print JSON")
	topic := fs.String("topic", "", "with --retention: compare the claims' retention with the replay horizon of this topic and its poison topic on the broker of BROKER/AMQP_URL/KAFKA_BROKERS")
	poison := fs.String("poison-topic", "", "the poison topic (default TOPIC.poison)")
	var retention durationValue
	fs.Var(&retention, "retention", "with --topic: the consumer's claim retention (consumer.Config.Retention), e.g. 30d")
	var bf brokerFlags
	bf.register(fs)
	if err := c.parse(fs, args); err != nil {
		return err
	}
	if (*topic == "") != (retention.d == 0) {
		return &usageError{msg: "stats: --topic and --retention go together"}
	}
	st, closePool, err := c.connect(ctx)
	if err != nil {
		return err
	}
	defer closePool()
	s, err := st.Stats(ctx)
	if err != nil {
		return c.fail(ctx, "stats", err)
	}
	parked, err := pg.ParkingOf(st).Stats(ctx)
	if err != nil {
		return c.fail(ctx, "stats", err)
	}
	var horizon *horizonReport
	if *topic != "" {
		*poison = cmp.Or(*poison, *topic+".poison")
		bcfg, err := bf.brokerConfig()
		if err != nil {
			return err
		}
		rep, err := replayHorizon(ctx, bcfg, *topic, *poison, retention.d)
		if err != nil {
			return bf.redactErr(fmt.Errorf("stats: replay horizon: %w", err), c.redact)
		}
		horizon = &rep
	}
	var lags []positionLag
	var lagNote string
	if len(s.KafkaPositions) > 0 {
		bcfg, err := bf.brokerConfig()
		if err != nil {
			lagNote = "lag unknown: " + c.redact(err.Error())
			lags = withoutLags(s.KafkaPositions)
		} else {
			lags, lagNote = positionLags(ctx, bcfg, s.KafkaPositions)
			lagNote = c.redact(lagNote)
		}
	}
	if *asJSON {
		return printJSON(stdout, struct {
			store.Stats
			Horizon *horizonReport   `json:"retention_horizon,omitempty"`
			Lags    []positionLag    `json:"kafka_position_lags,omitempty"`
			Parked  []pg.ParkedStats `json:"parked"`
		}{s, horizon, lags, nonNil(parked)})
	}
	layout := "plain"
	if s.Partitioned {
		layout = fmt.Sprintf("partitioned by event day, %d partitions", s.Partitions)
	}
	printf(stdout, "claim table %s (%s)\n", tableName(st), layout)
	tw := newTable(stdout)
	printlnTo(tw, "CONSUMER\tCLAIMS\tOLDEST\tNEWEST")
	for _, cs := range s.Consumers {
		printf(tw, "%s\t%d\t%s\t%s\n", cs.Consumer, cs.Claims, cs.Oldest.UTC().Format(time.RFC3339), cs.Newest.UTC().Format(time.RFC3339))
	}
	_ = tw.Flush()
	perClaim := "n/a"
	if s.Claims > 0 {
		perClaim = fmt.Sprintf("%.0f B", s.BytesPerClaim)
	}
	printf(stdout, "total %d claims; table %s, indexes %s; ~%s per claim (indexes and free space included)\n",
		s.Claims, formatBytes(s.TableBytes), formatBytes(s.IndexBytes), perClaim)
	printPositions(stdout, lags, lagNote)
	if len(parked) > 0 {
		tw := newTable(stdout)
		printlnTo(tw, "CONSUMER\tPARKED KEYS\tPARKED MESSAGES\tOLDEST PARKED")
		for _, p := range parked {
			printf(tw, "%s\t%d\t%d\t%s ago\n", p.Consumer, p.Keys, p.Messages, opfmt.Age(time.Since(p.Oldest)))
		}
		_ = tw.Flush()
	}
	if horizon != nil {
		printf(stdout, "%s\n", horizon)
	}
	return nil
}

// horizonReport compares a retention with the replay horizon of a topic
// and its poison topic, as a running consumer logs it.
type horizonReport struct {
	Topic         string        `json:"topic"`
	PoisonTopic   string        `json:"poison_topic"`
	Retention     time.Duration `json:"retention_ns"`
	ReplayHorizon time.Duration `json:"replay_horizon_ns"` // math.MaxInt64: unbounded
	Unbounded     bool          `json:"replay_horizon_unbounded"`
	Exceeded      bool          `json:"horizon_exceeds_retention"`
}

// probe is a subscriber of cfg's broker for questions: it never
// subscribes, so the group or durable it needs is never joined.
func probe(cfg brokers.Config) (message.Subscriber, error) {
	cfg.Kafka.ConsumerGroup = cmp.Or(cfg.Kafka.ConsumerGroup, "claimtx-stats")
	cfg.NATS.Durable = cmp.Or(cfg.NATS.Durable, "claimtx-stats")
	return brokers.NewSubscriber(cfg, nil)
}

func replayHorizon(ctx context.Context, cfg brokers.Config, topic, poison string, retention time.Duration) (horizonReport, error) {
	sub, err := probe(cfg)
	if err != nil {
		return horizonReport{}, err
	}
	defer func() { _ = sub.Close() }()
	longest, ok, err := replay.Horizon(ctx, sub, topic, poison)
	if err != nil {
		return horizonReport{}, err
	}
	if !ok {
		return horizonReport{}, fmt.Errorf("broker %q cannot tell its replay horizon", cfg.Kind)
	}
	return horizonReport{Topic: topic, PoisonTopic: poison, Retention: retention, ReplayHorizon: longest,
		Unbounded: longest == brokers.UnboundedHorizon, Exceeded: longest > retention}, nil
}

func (r horizonReport) String() string {
	h := opfmt.FormatHorizon(r.ReplayHorizon)
	verdict := "OK: claims outlive every delivery the broker can still make"
	if r.Exceeded {
		// Whether the consumer runs an expiry guard is not known here.
		verdict = "WARNING: the broker can deliver a message older than the retention, whose claim cleanup may have deleted: a consumer without an expiry guard applies it again, one with a guard (consumer.Config.Retention with an event time) poisons it as expired (docs/operations.md, Checking the window against the broker)"
	}
	return fmt.Sprintf("retention %s, replay horizon %s (%s, %s): %s", opfmt.FormatDuration(r.Retention), h, r.Topic, r.PoisonTopic, verdict)
}

// positionLag is a stored Kafka position with the end offset and the
// records past it, when the broker could be asked.
type positionLag struct {
	store.KafkaPosition
	EndOffset *int64 `json:"end_offset,omitempty"`
	Lag       *int64 `json:"lag,omitempty"`
}

func withoutLags(ps []store.KafkaPosition) []positionLag {
	out := make([]positionLag, len(ps))
	for i, p := range ps {
		out[i].KafkaPosition = p
	}
	return out
}

// positionLags adds the end offsets and lags when cfg is Kafka; a failure
// is a note, not an error: the positions stand on their own.
func positionLags(ctx context.Context, cfg brokers.Config, ps []store.KafkaPosition) ([]positionLag, string) {
	out := withoutLags(ps)
	if cfg.Kind != brokers.KindKafka {
		return out, "lag unknown"
	}
	sub, err := probe(cfg)
	if err != nil {
		return out, fmt.Sprintf("lag unknown: %v", err)
	}
	defer func() { _ = sub.Close() }()
	endOffsets, ok := kafkarecord.EndOffsets(sub)
	if !ok {
		return out, ""
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	ends := map[string]map[int32]int64{}
	for i := range out {
		topic := out[i].Topic
		if _, done := ends[topic]; !done {
			e, err := endOffsets(ctx, topic)
			if err != nil {
				return out, fmt.Sprintf("lag unknown: %v", err)
			}
			ends[topic] = e
		}
		if end, ok := ends[topic][out[i].Partition]; ok {
			lag := max(end-out[i].SettledBelow, 0)
			out[i].EndOffset, out[i].Lag = &end, &lag
		}
	}
	return out, ""
}

func printPositions(w io.Writer, ps []positionLag, note string) {
	if len(ps) == 0 {
		return
	}
	printf(w, "kafka positions stored with the claims (every record below SETTLED_BELOW is settled)\n")
	tw := newTable(w)
	printlnTo(tw, "CONSUMER\tTOPIC\tPARTITION\tSETTLED_BELOW\tEND\tLAG\tUPDATED")
	for _, p := range ps {
		end, lag := "?", "?"
		if p.EndOffset != nil {
			end, lag = fmt.Sprint(*p.EndOffset), fmt.Sprint(*p.Lag)
		}
		printf(tw, "%s\t%s\t%d\t%d\t%s\t%s\t%s\n", p.Consumer, p.Topic, p.Partition, p.SettledBelow, end, lag, p.UpdatedAt.UTC().Format(time.RFC3339))
	}
	_ = tw.Flush()
	if note != "" {
		printf(w, "%s (END and LAG need --broker kafka and --kafka-brokers, or BROKER and KAFKA_BROKERS)\n", note)
	}
}
