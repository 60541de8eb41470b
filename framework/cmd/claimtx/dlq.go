package main

import (
	"cmp"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/framework/cmd/claimtx/internal/dlq"
	"github.com/claimtx/claimtx/framework/cmd/claimtx/internal/opfmt"
	"github.com/claimtx/claimtx/internal/config"
	"github.com/claimtx/claimtx/internal/pg"
	"github.com/claimtx/claimtx/internal/poison"
)

// `claimtx dlq`: browse, classify and replay a consumer's poison
// destination. The machinery is framework/cmd/claimtx/internal/dlq (the web console reuses it);
// this file is flags and output.

const dlqUsage = `Usage: claimtx dlq SUBCOMMAND [flags]

  list      list the dead letters of a poison destination: reason, age, key, handler, topic, fingerprint
  inspect   show dead letters in full: every metadata entry, the payload, the classification
  replay    republish dead letters to their topic (--dry-run: classify only)

The broker comes from BROKER, AMQP_URL, KAFKA_BROKERS and the other variables
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

// dlqFlags are the flags of the dlq subcommands.
type dlqFlags struct {
	*common
	brokerFlags
	stderr                  io.Writer
	sub                     string
	consumer, topic, poison string
	keySpec                 string
	keyMaxBytes             int
	hashOverlong            bool
	reason, key, id         string
	olderThan, newerThan    durationValue
	limit                   int64
	asJSON                  bool
	progress                string
	dryRun, includeApplied  bool
	fromStart               bool
	batchSize               int
	rate                    float64
	maxPayload              int
	classify                bool
	source                  dlq.Source
	now                     time.Time
}

func cmdDLQ(ctx context.Context, args []string, stdout, stderr io.Writer, getenv env) error {
	sub, rest, err := subcommand("dlq", dlqUsage, args, stdout, "list", "inspect", "replay")
	if err != nil {
		return err
	}
	fs, c := newFlags("dlq "+sub, stdout, getenv)
	d := &dlqFlags{common: c, stderr: stderr, sub: sub}
	d.register(fs)
	fs.StringVar(&d.consumer, "consumer", "", "consumer name whose dead letters and claims these are (required by replay)")
	fs.StringVar(&d.topic, "topic", "", "the consumer's topic: where replayed letters go back to (env TOPIC)")
	fs.StringVar(&d.poison, "poison-topic", "", "the poison destination (default <--topic>.poison)")
	fs.StringVar(&d.keySpec, "key-spec", "", "today's key spec of the consumer, e.g. json:order_id (env KEY; required by replay)")
	fs.IntVar(&d.keyMaxBytes, "key-max-bytes", 0, "the consumer's KeyPolicy.MaxBytes (default 512)")
	fs.BoolVar(&d.hashOverlong, "key-hash-overlong", false, "the consumer's KeyPolicy.HashOverlong")
	fs.StringVar(&d.id, "id", "", "only the letter with this message UUID")
	fs.StringVar(&d.reason, "reason", "", "only letters whose poison reason contains this text")
	fs.StringVar(&d.key, "key", "", "only letters with this key (today's with --key-spec, else the one stamped when poisoned)")
	fs.Var(&d.olderThan, "older-than", "only letters poisoned longer ago than this (e.g. 2d)")
	fs.Var(&d.newerThan, "newer-than", "only letters poisoned within this (e.g. 7d)")
	fs.Int64Var(&d.limit, "limit", 0, "stop after this many selected letters")
	fs.BoolVar(&d.asJSON, "json", false, "one JSON object per line")
	fs.StringVar(&d.progress, "progress", "auto", "progress on stderr: auto (a bar on a terminal, log lines otherwise, for 1000 letters or more), bar, log or none")
	switch sub {
	case "inspect":
		fs.IntVar(&d.maxPayload, "max-payload", 4096, "print at most this many payload bytes (0: all)")
	case "replay":
		fs.BoolVar(&d.dryRun, "dry-run", false, "classify and print what would be replayed; change nothing")
		fs.BoolVar(&d.includeApplied, "include-applied", false, "replay already applied letters too (duplicates for their claims)")
		fs.BoolVar(&d.fromStart, "from-start", false, "Kafka: read from the earliest offset, not from the progress of the previous replay")
		fs.IntVar(&d.batchSize, "batch-size", 500, "letters classified and republished per round trip")
		fs.Float64Var(&d.rate, "rate", 0, "replay at most this many letters per second (0: no limit)")
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
	d.keySpec = cmp.Or(d.keySpec, d.getenv("KEY"))
	d.topic = cmp.Or(d.topic, d.getenv("TOPIC"))
	switch {
	case d.topic == "" && d.poison == "":
		return d.usage("no destination: pass --topic (the poison destination is <topic>.poison) or --poison-topic")
	case d.sub == "replay" && d.topic == "":
		return d.usage("replay needs --topic (or TOPIC), the topic the letters go back to")
	case d.sub == "replay" && d.consumer == "":
		return d.usage("replay needs --consumer, whose claims decide what is applied")
	case d.sub == "replay" && d.keySpec == "":
		return d.usage("replay needs today's key spec to classify: pass --key-spec or set KEY")
	case d.batchSize < 0 || d.rate < 0 || d.limit < 0 || d.maxPayload < 0 || d.keyMaxBytes < 0:
		return d.usage("--batch-size, --rate, --limit, --max-payload and --key-max-bytes must not be negative")
	}
	if d.consumer != "" {
		if err := config.ValidateConsumer("--consumer", d.consumer); err != nil {
			return err
		}
	}
	switch d.progress {
	case "auto", "bar", "log", "none":
	default:
		return d.usage("--progress %q: want auto, bar, log or none", d.progress)
	}
	d.poison = cmp.Or(d.poison, d.topic+".poison")
	var cls *dlq.Classifier
	if d.keySpec != "" {
		key, err := framework.ParseKeySpec(d.keySpec)
		if err != nil {
			return d.usage("--key-spec %q: %v", d.keySpec, err)
		}
		if d.consumer == "" {
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
		var memo dlq.Memo
		// A schema migrated before the memo existed has no memo table:
		// then there is nothing to report or clear.
		if ok, err := poison.MemoTableExists(ctx, d.pool, names); err != nil {
			return d.fail(ctx, "dlq "+d.sub, err)
		} else if ok {
			memo = poison.MemoTable{DB: d.pool, Names: names}
		}
		cls = newClassifier(d, st.Config().Schema, st.Config().ClaimsTable, key, memo)
	}
	bcfg, err := d.brokerConfig()
	if err != nil {
		return err
	}
	d.now = time.Now()
	src, err := dlq.Open(ctx, bcfg, dlq.Options{Destination: d.poison, Consumer: d.consumer, Resume: d.sub == "replay" && !d.fromStart})
	if err != nil {
		return d.brokerFail(err)
	}
	d.source = src
	defer func() { _ = src.Close() }()
	d.classify = cls != nil
	r := &dlq.Run{
		Source: src, Classifier: cls, Topic: d.topic, Limit: d.limit, BatchSize: d.batchSize,
		DryRun: d.dryRun, IncludeApplied: d.includeApplied, Rate: d.rate,
		Filter: dlq.Filter{Consumer: d.consumer, Topic: d.topic, ID: d.id, Reason: d.reason, Key: d.key,
			OlderThan: d.olderThan.d, NewerThan: d.newerThan.d, Now: d.now},
	}
	pr := d.newProgress(src.Total())
	r.OnBatch = pr.update
	var tw *tabwriter.Writer
	switch {
	case d.asJSON:
		enc := json.NewEncoder(d.stdout)
		r.OnLetter = func(l *dlq.Letter) error { return enc.Encode(d.letterJSON(l)) }
	case d.sub == "inspect":
		r.OnLetter = func(l *dlq.Letter) error {
			pr.clear()
			d.printInspect(l)
			return nil
		}
	default:
		tw = newTable(d.stdout)
		header := false
		r.OnLetter = func(l *dlq.Letter) error {
			if !header {
				pr.clear()
				d.printHeader(tw)
				header = true
			}
			d.printRow(tw, l)
			return nil
		}
		// Rows are aligned per batch: a large destination is not held in
		// memory to align it as a whole.
		onBatch := r.OnBatch
		r.OnBatch = func(t dlq.Totals) {
			pr.clear()
			_ = tw.Flush()
			onBatch(t)
		}
	}
	var tot dlq.Totals
	if d.sub == "replay" {
		tot, err = r.Replay(ctx)
	} else {
		tot, err = r.Browse(ctx)
	}
	pr.finish(tot)
	if tw != nil {
		_ = tw.Flush()
	}
	d.printTotals(tot, err)
	if err != nil {
		if ctx.Err() != nil && d.sub == "replay" && !d.dryRun {
			printf(d.stderr, "interrupted: %d letters replayed; nothing is lost, run the same command again to resume\n", tot.Replayed)
		}
		return d.brokerFail(fmt.Errorf("dlq %s: %w", d.sub, err))
	}
	return nil
}

// newClassifier builds the Classifier of the dead letters. With memo, a
// dry run reports "poison-memo" letters and a replay clears the memo of
// every key it republishes, so its copy reaches the handler.
func newClassifier(d *dlqFlags, schema, table string, key framework.KeyFunc, memo dlq.Memo) *dlq.Classifier {
	return &dlq.Classifier{
		Pool: d.pool, Schema: schema, Table: table, Consumer: d.consumer, Key: key,
		Policy: framework.KeyPolicy{MaxBytes: d.keyMaxBytes, HashOverlong: d.hashOverlong},
		Memo:   memo,
	}
}

// brokerFail removes the broker's and the database's passwords from err's
// text, keeping it matchable.
func (d *dlqFlags) brokerFail(err error) error {
	var ce *framework.ConfigError
	if errors.As(err, &ce) {
		return err
	}
	return d.redactErr(err, d.redact)
}

// letterJSON is the JSON line of a letter.
func (d *dlqFlags) letterJSON(l *dlq.Letter) map[string]any {
	m := map[string]any{
		"position":       l.Position,
		"id":             l.Msg.UUID,
		"destination":    d.source.Destination(),
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
		age, _ := l.Age(d.now)
		m["age_seconds"] = age.Seconds()
	}
	if l.Handled {
		m["handled"] = true // a previous replay of --consumer went past it (Kafka)
	}
	if d.classify && l.Class != "" {
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
		if !d.dryRun {
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

func (d *dlqFlags) age(l *dlq.Letter) string {
	age, ok := l.Age(d.now)
	if !ok {
		return "?"
	}
	return opfmt.Age(age)
}

func (d *dlqFlags) printHeader(tw io.Writer) {
	cols := "POSITION\tID\tAGE\tCONSUMER\tTOPIC\tHANDLER\tKEY\tFINGERPRINT"
	if d.classify {
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
	key := dlq.EffectiveKey(l)
	if d.classify && l.KeyErr != nil {
		key = "(none)"
	}
	row := []string{pos, l.Msg.UUID, d.age(l), cmp.Or(l.Stamps.Consumer, "-"), cmp.Or(l.Stamps.Topic, "-"),
		cmp.Or(l.Stamps.Handler, "-"), cmp.Or(opfmt.OneLine(key, 60), "-"), l.FingerprintHex()}
	if d.classify {
		row = append(row, d.classText(l))
	}
	if d.sub == "replay" {
		act := string(l.Action)
		switch {
		case l.Replayed:
			act = "replayed"
		case d.dryRun && l.Action == dlq.ActionReplay:
			act = "would replay"
		case l.Why != "":
			act += ": " + l.Why
		}
		row = append(row, act)
	}
	reason := l.Stamps.Reason
	if d.classify && l.KeyErr != nil {
		reason = "today: " + l.KeyErr.Error() + "; poisoned: " + reason
	}
	row = append(row, opfmt.OneLine(reason, 100))
	printlnTo(tw, strings.Join(row, "\t"))
}

func (d *dlqFlags) printInspect(l *dlq.Letter) {
	w := d.stdout
	printf(w, "letter %s at %s in %s\n", l.Msg.UUID, l.Position, d.source.Destination())
	if l.Handled {
		printf(w, "  replay progress   a previous replay of %s went past it\n", d.consumer)
	}
	poisoned := "unknown (copy made before claimtx stamped the time)"
	if !l.Stamps.PoisonedAt.IsZero() {
		poisoned = l.Stamps.PoisonedAt.Format(time.RFC3339Nano) + " (" + d.age(l) + " ago)"
	}
	printf(w, "  poisoned          %s\n", poisoned)
	printf(w, "  consumer          %s\n", cmp.Or(l.Stamps.Consumer, "-"))
	printf(w, "  original topic    %s\n", cmp.Or(l.Stamps.Topic, "-"))
	printf(w, "  handler           %s\n", cmp.Or(l.Stamps.Handler, "-"))
	printf(w, "  reason            %s\n", l.Stamps.Reason)
	printf(w, "  permanent         %s\n", cmp.Or(l.Stamps.Permanent, "-"))
	printf(w, "  key when poisoned %s\n", cmp.Or(l.Stamps.Key, "-"))
	if d.classify {
		if l.KeyErr != nil {
			printf(w, "  key today         none: %v\n", l.KeyErr)
		} else {
			printf(w, "  key today         %s\n", l.Key)
		}
		printf(w, "  class             %s\n", d.classText(l))
	}
	printf(w, "  fingerprint       %s\n", l.FingerprintHex())
	printf(w, "  metadata\n")
	keys := make([]string, 0, len(l.Msg.Metadata))
	for k := range l.Msg.Metadata {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
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

// printTotals prints the summary: stdout for humans, a final JSON object
// with --json.
func (d *dlqFlags) printTotals(t dlq.Totals, err error) {
	if d.asJSON {
		if d.sub == "replay" {
			_ = json.NewEncoder(d.stdout).Encode(map[string]any{"totals": t, "dry_run": d.dryRun, "complete": err == nil})
		}
		return
	}
	w := d.stdout
	dest := d.source.Destination()
	printf(w, "%d letters read from %s, %d selected", t.Seen, dest, t.Selected)
	var skipped []string
	if t.OtherConsumer > 0 {
		skipped = append(skipped, fmt.Sprintf("%d of other consumers", t.OtherConsumer))
	}
	if t.OtherTopic > 0 {
		skipped = append(skipped, fmt.Sprintf("%d from other topics", t.OtherTopic))
	}
	if t.FilteredOut > 0 {
		skipped = append(skipped, fmt.Sprintf("%d filtered out", t.FilteredOut))
	}
	if len(skipped) > 0 {
		printf(w, " (not selected: %s)", strings.Join(skipped, ", "))
	}
	printlnTo(w)
	if d.classify {
		printf(w, "  already applied   %d\n  would apply       %d\n  still bad         %d\n  poison memo       %d\n",
			t.Applied, t.WouldApply, t.StillBad, t.Memo)
		if t.AppliedDifferent > 0 {
			printf(w, "WARNING: %d already applied with a DIFFERENT payload fingerprint: the same key was claimed for another payload, a producer or key-derivation bug; replaying them would be acked as duplicates and change nothing\n", t.AppliedDifferent)
		}
	}
	if d.sub != "replay" {
		return
	}
	if d.dryRun {
		would := t.WouldApply + t.Memo
		if d.includeApplied {
			would += t.Applied
		}
		printf(w, "dry run: %d would be replayed to %s; nothing changed\n", would, d.topic)
		return
	}
	printf(w, "%d replayed to %s\n", t.Replayed, d.topic)
}
