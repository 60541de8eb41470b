package claimtxcli

import (
	"cmp"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/framework/cmd/claimtx/internal/dlq"
	"github.com/claimtx/claimtx/framework/cmd/claimtx/internal/opfmt"
	"github.com/claimtx/claimtx/internal/config"
	"github.com/claimtx/claimtx/internal/pg"
)

// `claimtx dlq`: flags and output over internal/dlq.

const dlqUsage = `Usage: claimtx dlq SUBCOMMAND [flags]

  list      list the dead letters of a poison destination: reason, age, key, handler, topic, fingerprint
  inspect   show dead letters in full: every metadata entry, the payload, the classification
  replay    republish dead letters to their topic (--dry-run: classify only)

The broker comes from BROKER, AMQP_URL, KAFKA_BROKERS, NATS_URL and the other variables
of brokers.LoadConfig("") (or --broker-config FILE, which they override), and
--broker, --amqp-url, --kafka-brokers override both. Nothing is consumed
by list, inspect or a dry run.

Run "claimtx dlq SUBCOMMAND -h" for a subcommand's flags and an example.
`

func init() {
	synopses["dlq list"] = `List the dead letters of a poison destination (default <--topic>.poison) without consuming them:
position, age, consumer, original topic, handler, key, payload fingerprint and reason; with
--key-spec also today's key and the classification against the claims. On RabbitMQ the
messages are taken with basic.get and requeued in place when the command ends; on Kafka they
are read outside any consumer group. --json prints one JSON object per line. A * after a
Kafka position: a previous replay of --consumer went past it (it was replayed or passed over).

Example:
  BROKER=kafka KAFKA_BROKERS=kafka:9092 claimtx dlq list --topic order-completed --reason timeout --older-than 2d`
	synopses["dlq inspect"] = `Show dead letters in full: every metadata entry, the payload, and with --key-spec the key
today's spec derives and the classification against the claims. Select them with --id or
the filters of list. Nothing is consumed.

Example:
  claimtx dlq inspect --topic order-completed --consumer loyalty --key-spec 'json:order_id' --id 2f1c9a7e-...`
	synopses["dlq replay"] = `Republish dead letters to the topic they were consumed from, keeping their identity
(payload, event id, key fields, event time, traceparent, UUID; the poison bookkeeping is
removed), and remove each from the poison destination only after the broker confirmed the
republish (RabbitMQ: publisher confirms, then ack; Kafka: acks, then the replay progress is
committed for the consumer group claimtx-dlq-<consumer>, so a rerun starts after it).

Each dead letter is classified against the claims with today's --key-spec: already applied
(a claim exists; its payload fingerprint the same, DIFFERENT, or not recorded), would apply
(no claim), still bad (today's spec cannot key it), poison memo. By default only "would
apply" letters are replayed; --include-applied adds the already applied ones (harmless
duplicates for their claims). --dry-run prints the classification of each and the totals and
changes nothing. Killed at any point, nothing is lost: every letter is still in the poison
destination, republished, or both (then its claim makes it a duplicate): run it again.

Example:
  claimtx dlq replay --topic order-completed --consumer loyalty --key-spec 'template:order-completed:{payload.order_id}' --newer-than 7d --dry-run`
}

// dlqFlags are the flags of the dlq subcommands, most straight into the
// embedded dlq.Run.
type dlqFlags struct {
	*common
	brokerFlags
	keyFlags
	dlq.Run
	stderr               io.Writer
	cli                  Config
	sub                  string
	poison               string
	olderThan, newerThan durationValue
	asJSON               bool
	progress             string
	fromStart            bool
	maxPayload           int
}

func cmdDLQ(ctx context.Context, args []string, stdout, stderr io.Writer, getenv env, cfg Config) error {
	sub, rest, err := subcommand("dlq", dlqUsage, args, stdout, "list", "inspect", "replay")
	if err != nil {
		return err
	}
	fs, c := newFlags("dlq "+sub, stdout, getenv)
	d := &dlqFlags{common: c, stderr: stderr, sub: sub, cli: cfg}
	d.brokerFlags.register(fs)
	fs.StringVar(&d.Filter.Consumer, "consumer", "", "consumer name whose dead letters and claims these are (required by replay)")
	fs.StringVar(&d.Topic, "topic", "", "the consumer's topic: where replayed letters go back to (env TOPIC)")
	fs.StringVar(&d.poison, "poison-topic", "", "the poison destination (default <--topic>.poison)")
	d.keyFlags.register(fs, "today's key spec of the consumer, e.g. json:order_id (env KEY; required by replay)", "the consumer's ")
	fs.StringVar(&d.Filter.ID, "id", "", "only the letter with this message UUID")
	fs.StringVar(&d.Filter.Reason, "reason", "", "only letters whose poison reason contains this text")
	fs.StringVar(&d.Filter.Key, "key", "", "only letters with this key (today's with --key-spec, else the one stamped when poisoned)")
	fs.Var(&d.olderThan, "older-than", "only letters poisoned longer ago than this (e.g. 2d)")
	fs.Var(&d.newerThan, "newer-than", "only letters poisoned within this (e.g. 7d)")
	fs.Int64Var(&d.Limit, "limit", 0, "stop after this many selected letters")
	fs.BoolVar(&d.asJSON, "json", false, "one JSON object per line")
	fs.StringVar(&d.progress, "progress", "auto", "progress on stderr: auto (a bar on a terminal, log lines otherwise, for 1000 letters or more), bar, log or none")
	switch sub {
	case "inspect":
		fs.IntVar(&d.maxPayload, "max-payload", 4096, "print at most this many payload bytes (0: all)")
	case "replay":
		fs.BoolVar(&d.DryRun, "dry-run", false, "classify and print what would be replayed; change nothing")
		fs.BoolVar(&d.IncludeApplied, "include-applied", false, "replay already applied letters too (duplicates for their claims)")
		fs.BoolVar(&d.fromStart, "from-start", false, "Kafka: read from the earliest offset, not from the progress of the previous replay")
		fs.IntVar(&d.BatchSize, "batch-size", 500, "letters classified and republished per round trip")
		fs.Float64Var(&d.Rate, "rate", 0, "replay at most this many letters per second (0: no limit)")
	}
	if err := c.parse(fs, rest); err != nil {
		return err
	}
	return d.run(ctx)
}

func (d *dlqFlags) usage(format string, a ...any) error {
	return badFlags("dlq "+d.sub, format, a...)
}

func (d *dlqFlags) run(ctx context.Context) error {
	d.spec = cmp.Or(d.spec, d.getenv("KEY"))
	d.Topic = cmp.Or(d.Topic, d.getenv("TOPIC"))
	consumer := d.Filter.Consumer
	switch {
	case d.Topic == "" && d.poison == "":
		return d.usage("no destination: pass --topic (the poison destination is <topic>.poison) or --poison-topic")
	case d.sub == "replay" && d.Topic == "":
		return d.usage("replay needs --topic (or TOPIC), the topic the letters go back to")
	case d.sub == "replay" && consumer == "":
		return d.usage("replay needs --consumer, whose claims decide what is applied")
	case d.sub == "replay" && d.spec == "":
		return d.usage("replay needs today's key spec to classify: pass --key-spec or set KEY")
	case d.BatchSize < 0 || d.Rate < 0 || d.Limit < 0 || d.maxPayload < 0 || d.policy.MaxBytes < 0:
		return d.usage("--batch-size, --rate, --limit, --max-payload and --key-max-bytes must not be negative")
	}
	if consumer != "" {
		if err := config.ValidateConsumer("--consumer", consumer); err != nil {
			return err
		}
	}
	switch d.progress {
	case "auto", "bar", "log", "none":
	default:
		return d.usage("--progress %q: want auto, bar, log or none", d.progress)
	}
	d.poison = cmp.Or(d.poison, d.Topic+".poison")
	if d.spec != "" {
		key, err := d.cli.Extractors.ParseKey(d.spec)
		if err != nil {
			return d.usage("--key-spec %q: %v", d.spec, err)
		}
		if consumer == "" {
			return d.usage("--key-spec classifies against the claims of --consumer: pass it too")
		}
		st, closePool, err := d.connect(ctx)
		if err != nil {
			return err
		}
		defer closePool()
		if err := d.migrated(ctx, st, "dlq "+d.sub); err != nil {
			return err
		}
		names := pg.NewNames(st.Config().Schema, st.Config().ClaimsTable, st.Config().OutboxTable)
		memo, err := dlq.MemoOf(ctx, d.pool, names)
		if err != nil {
			return d.fail(ctx, "dlq "+d.sub, err)
		}
		d.Classifier = &dlq.Classifier{Pool: d.pool, Schema: names.Schema, Table: names.Claims, Consumer: consumer, Key: key, Policy: d.policy, Memo: memo}
	}
	bcfg, err := d.browseConfig(d.cli)
	if err != nil {
		return err
	}
	d.Filter.Now = time.Now()
	src, err := dlq.Open(ctx, bcfg, dlq.Options{Destination: d.poison, Consumer: consumer, Resume: d.sub == "replay" && !d.fromStart})
	if err != nil {
		return d.brokerFail(err)
	}
	defer func() { _ = src.Close() }()
	d.Source = src
	d.Filter.Topic, d.Filter.OlderThan, d.Filter.NewerThan = d.Topic, d.olderThan.d, d.newerThan.d
	pr := d.newProgress(src.Total())
	d.OnBatch = pr.update
	var tw *tabwriter.Writer
	switch {
	case d.asJSON:
		enc := json.NewEncoder(d.stdout)
		d.OnLetter = func(l *dlq.Letter) error { return enc.Encode(d.letterJSON(l)) }
	case d.sub == "inspect":
		d.OnLetter = func(l *dlq.Letter) error {
			pr.clear()
			d.printInspect(l)
			return nil
		}
	default:
		tw = newTable(d.stdout)
		header := false
		d.OnLetter = func(l *dlq.Letter) error {
			if !header {
				pr.clear()
				d.printHeader(tw)
				header = true
			}
			d.printRow(tw, l)
			return nil
		}
		// Rows are aligned per batch, not held in memory as a whole.
		d.OnBatch = func(t dlq.Totals) {
			pr.clear()
			_ = tw.Flush()
			pr.update(t)
		}
	}
	var tot dlq.Totals
	if d.sub == "replay" {
		tot, err = d.Replay(ctx)
	} else {
		tot, err = d.Browse(ctx)
	}
	pr.finish(tot)
	if tw != nil {
		_ = tw.Flush()
	}
	d.printTotals(tot, err)
	if err != nil {
		if ctx.Err() != nil && d.sub == "replay" && !d.DryRun {
			printf(d.stderr, "interrupted: %d letters replayed; nothing is lost, run the same command again to resume\n", tot.Replayed)
		}
		return d.brokerFail(fmt.Errorf("dlq %s: %w", d.sub, err))
	}
	return nil
}

func (d *dlqFlags) brokerFail(err error) error {
	var ce *framework.ConfigError
	if errors.As(err, &ce) {
		return err
	}
	return d.redactErr(err, d.redact)
}

func (d *dlqFlags) letterJSON(l *dlq.Letter) map[string]any {
	m := map[string]any{
		"position":       l.Position,
		"id":             l.Msg.UUID,
		"destination":    d.Source.Destination(),
		"original_topic": l.Stamps.Topic,
		"consumer":       l.Stamps.Consumer,
		"handler":        l.Stamps.Handler,
		"reason":         l.Stamps.Reason,
		"poisoned_key":   l.Stamps.Key,
		"fingerprint":    l.FingerprintHex(),
	}
	if l.Stamps.Permanent != "" {
		m["permanent"] = l.Stamps.Permanent == "true"
	}
	if !l.Stamps.PoisonedAt.IsZero() {
		m["poisoned_at"] = l.Stamps.PoisonedAt.Format(time.RFC3339Nano)
		age, _ := l.Age(d.Filter.Now)
		m["age_seconds"] = age.Seconds()
	}
	if l.Handled {
		m["handled"] = true // a previous replay of --consumer went past it (Kafka)
	}
	if l.CopyOf != "" {
		m["copy_of"] = l.CopyOf // the same message poisoned again: replayed once
	}
	if d.Classifier != nil && l.Class != "" {
		m["key"] = l.Key
		m["class"] = l.Class
		if l.KeyErr != nil {
			m["key_error"] = l.KeyErr.Error()
		}
		if l.Match != "" {
			m["fingerprint_match"] = l.Match
		}
	}
	if d.sub == "replay" {
		m["action"] = l.Action
		if l.Why != "" {
			m["why"] = l.Why
		}
		if !d.DryRun {
			m["replayed"] = l.Replayed
		}
	}
	if d.sub == "inspect" {
		m["metadata"] = l.Msg.Metadata
		if utf8.Valid(l.Msg.Payload) {
			m["payload"] = string(l.Msg.Payload)
		} else {
			m["payload_base64"] = base64.StdEncoding.EncodeToString(l.Msg.Payload)
		}
	}
	return m
}

func (d *dlqFlags) printHeader(tw io.Writer) {
	cols := "POSITION\tID\tAGE\tCONSUMER\tTOPIC\tHANDLER\tKEY\tFINGERPRINT"
	if d.Classifier != nil {
		cols += "\tCLASS"
	}
	if d.sub == "replay" {
		cols += "\tACTION"
	}
	printlnTo(tw, cols+"\tREASON")
}

func (d *dlqFlags) classText(l *dlq.Letter) string {
	switch {
	case l.Class == dlq.ClassApplied && l.Match == dlq.MatchDifferent:
		return "ALREADY-APPLIED-DIFFERENT-PAYLOAD"
	case l.Class == dlq.ClassApplied:
		return string(l.Class) + " (fingerprint " + string(l.Match) + ")"
	case l.Class == "":
		return "-"
	}
	return string(l.Class)
}

func (d *dlqFlags) printRow(tw io.Writer, l *dlq.Letter) {
	pos := l.Position
	if l.Handled {
		pos += "*"
	}
	if l.CopyOf != "" {
		pos += " copy of " + l.CopyOf
	}
	key, reason := l.Shown()
	row := []string{pos, l.Msg.UUID, l.ShownAge(d.Filter.Now), cmp.Or(l.Stamps.Consumer, "-"), cmp.Or(l.Stamps.Topic, "-"),
		cmp.Or(l.Stamps.Handler, "-"), cmp.Or(opfmt.OneLine(key, 60), "-"), l.FingerprintHex()}
	if d.Classifier != nil {
		row = append(row, d.classText(l))
	}
	if d.sub == "replay" {
		act := string(l.Action)
		switch {
		case l.Replayed:
			act = "replayed"
		case d.DryRun && l.Action == dlq.ActionReplay:
			act = "would replay"
		case l.Why != "":
			act += ": " + l.Why
		}
		row = append(row, act)
	}
	row = append(row, opfmt.OneLine(reason, 100))
	printlnTo(tw, strings.Join(row, "\t"))
}

func (d *dlqFlags) printInspect(l *dlq.Letter) {
	w := d.stdout
	printf(w, "letter %s at %s in %s\n", l.Msg.UUID, l.Position, d.Source.Destination())
	if l.Handled {
		printf(w, "  replay progress   a previous replay of %s went past it\n", d.Filter.Consumer)
	}
	poisoned := "unknown (copy made before claimtx stamped the time)"
	if !l.Stamps.PoisonedAt.IsZero() {
		poisoned = l.Stamps.PoisonedAt.Format(time.RFC3339Nano) + " (" + l.ShownAge(d.Filter.Now) + " ago)"
	}
	printf(w, "  poisoned          %s\n", poisoned)
	printf(w, "  consumer          %s\n", cmp.Or(l.Stamps.Consumer, "-"))
	printf(w, "  original topic    %s\n", cmp.Or(l.Stamps.Topic, "-"))
	printf(w, "  handler           %s\n", cmp.Or(l.Stamps.Handler, "-"))
	printf(w, "  reason            %s\n", l.Stamps.Reason)
	printf(w, "  permanent         %s\n", cmp.Or(l.Stamps.Permanent, "-"))
	printf(w, "  key when poisoned %s\n", cmp.Or(l.Stamps.Key, "-"))
	if d.Classifier != nil {
		if l.KeyErr != nil {
			printf(w, "  key today         none: %v\n", l.KeyErr)
		} else {
			printf(w, "  key today         %s\n", l.Key)
		}
		printf(w, "  class             %s\n", d.classText(l))
	}
	printf(w, "  fingerprint       %s\n", l.FingerprintHex())
	printf(w, "  metadata\n")
	for _, k := range slices.Sorted(maps.Keys(l.Msg.Metadata)) {
		printf(w, "    %s = %s\n", k, l.Msg.Metadata[k])
	}
	payload, cut := opfmt.Payload(l.Msg.Payload, d.maxPayload)
	note := ""
	if cut {
		note = fmt.Sprintf(" (first %d shown; --max-payload 0 shows all)", d.maxPayload)
	}
	printf(w, "  payload, %d bytes%s\n", len(l.Msg.Payload), note)
	printf(w, "    %s\n\n", strings.ReplaceAll(payload, "\n", "\n    "))
}

// printTotals prints the summary; with --json a replay's final object.
func (d *dlqFlags) printTotals(t dlq.Totals, err error) {
	if d.asJSON {
		if d.sub == "replay" {
			_ = json.NewEncoder(d.stdout).Encode(map[string]any{"totals": t, "dry_run": d.DryRun, "complete": err == nil})
		}
		return
	}
	w := d.stdout
	dest := d.Source.Destination()
	printf(w, "%d letters read from %s, %d selected", t.Seen, dest, t.Selected)
	var skipped []string
	for _, s := range []struct {
		n    int64
		what string
	}{{t.OtherConsumer, "of other consumers"}, {t.OtherTopic, "from other topics"}, {t.FilteredOut, "filtered out"}} {
		if s.n > 0 {
			skipped = append(skipped, fmt.Sprintf("%d %s", s.n, s.what))
		}
	}
	if len(skipped) > 0 {
		printf(w, " (not selected: %s)", strings.Join(skipped, ", "))
	}
	printlnTo(w)
	if d.Classifier != nil {
		printf(w, "  already applied   %d\n  would apply       %d\n  still bad         %d\n  poison memo       %d\n",
			t.Applied, t.WouldApply, t.StillBad, t.Memo)
		if t.Repeated > 0 {
			printf(w, "  repeated copies   %d (the same message poisoned again: a consumer died between poisoning it and its ack; a replay sends it once)\n", t.Repeated)
		}
		if t.AppliedDifferent > 0 {
			printf(w, "WARNING: %d already applied with a DIFFERENT payload fingerprint: the same key was claimed for another payload, a producer or key-derivation bug; replaying them would be acked as duplicates and change nothing\n", t.AppliedDifferent)
		}
	}
	if d.sub != "replay" {
		return
	}
	if d.DryRun {
		would := t.WouldApply + t.Memo
		if d.IncludeApplied {
			would += t.Applied
		}
		printf(w, "dry run: %d would be replayed to %s; nothing changed\n", would, d.Topic)
		return
	}
	printf(w, "%d replayed to %s\n", t.Replayed, d.Topic)
}
