package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/claimtx/claimtx/store"
)

// `claimtx stats`: claims per consumer, sizes, Kafka positions (positions.go)
// and the retention against the replay horizon (horizon.go).

func init() {
	synopses["stats"] = "Claims per consumer, table and index size; with --topic and --retention, the claims' retention against the broker's replay horizon."
}

func cmdStats(ctx context.Context, args []string, stdout io.Writer, getenv env) error {
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
	var horizon *horizonReport
	if *topic != "" {
		if *poison == "" {
			*poison = *topic + ".poison"
		}
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
			Horizon *horizonReport `json:"retention_horizon,omitempty"`
			Lags    []positionLag  `json:"kafka_position_lags,omitempty"`
		}{s, horizon, lags})
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
	if horizon != nil {
		printf(stdout, "%s\n", horizon)
	}
	return nil
}
