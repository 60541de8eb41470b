package claimtxcli

import (
	"bufio"
	"cmp"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/framework/cmd/claimtx/internal/dlq"
	"github.com/claimtx/claimtx/framework/cmd/claimtx/internal/keycheck"
	"github.com/claimtx/claimtx/framework/cmd/claimtx/internal/opfmt"
)

// `claimtx keys check`: flags and output over internal/keycheck.

const keysUsage = `Usage: claimtx keys check [flags]

  check   verify a key spec against a sample of messages (a queue or topic, read
          without consuming, or a JSON-lines file); exit 1 on collisions

Run "claimtx keys check -h" for its flags and an example.
`

func init() {
	synopses["keys check"] = `Verify a key spec against a sample of messages, read without consuming them from a queue
or topic (RabbitMQ: basic.get, requeued in place when the command ends; Kafka: from the earliest
offset, outside any consumer group) or from a JSON-lines file (one object per line: "id",
"metadata" {name: value}, "payload" or "payload_base64"; the output of
"claimtx dlq inspect --json" is one). It reports:

  collisions     keys shared by different payloads: the later events would be acked as
                 duplicates of the first and lost. Exit status 1 when there is one.
  volatile keys  one payload under several keys: a key input that changes per copy (a
                 trace id, a delivery id) makes every redelivery apply again.
  unkeyable      messages the spec cannot key, grouped by reason.
  key length     min, p50, p90, p99, max in bytes (the key policy refuses or hashes keys
                 over --key-max-bytes).
  event time     with --time-spec: how many have one, why the others have not, the spread.

On a busy RabbitMQ queue the sampled messages wait until the command ends; sample a copy of
the traffic (a second queue bound to the same exchange) or a file instead.

Example:
  claimtx keys check --key-spec 'template:order-completed:{payload.order_id}' --time-spec metadata:event_time --file recorded.jsonl`
}

type keysFlags struct {
	*common
	brokerFlags
	topic, file string
	keyFlags
	timeSpec string
	cli      Config
	limit    int
	asJSON   bool
}

func cmdKeys(ctx context.Context, args []string, stdout, _ io.Writer, getenv env, cfg Config) error {
	_, rest, err := subcommand("keys", keysUsage, args, stdout, "check")
	if err != nil {
		return err
	}
	fs := quietFlagSet("keys check") // no database flags: it reads messages only
	k := &keysFlags{common: &common{getenv: getenv, stdout: stdout}, cli: cfg}
	k.brokerFlags.register(fs)
	fs.StringVar(&k.topic, "topic", "", "the queue or topic to sample (env TOPIC)")
	fs.StringVar(&k.file, "file", "", `a JSON-lines file to read instead ("-": stdin)`)
	k.keyFlags.register(fs, "the key spec to verify (env KEY)", "")
	fs.StringVar(&k.timeSpec, "time-spec", "", "an event-time spec to check too (env EVENT_TIME)")
	fs.IntVar(&k.limit, "limit", 10000, "sample at most this many messages (0: all)")
	fs.BoolVar(&k.asJSON, "json", false, "print the report as one JSON object")
	if err := k.parse(fs, rest); err != nil {
		return err
	}
	return k.run(ctx)
}

func (k *keysFlags) usage(format string, a ...any) error {
	return badFlags("keys check", format, a...)
}

func (k *keysFlags) run(ctx context.Context) error {
	k.spec = cmp.Or(k.spec, k.getenv("KEY"))
	k.timeSpec = cmp.Or(k.timeSpec, k.getenv("EVENT_TIME"))
	if k.file == "" {
		k.topic = cmp.Or(k.topic, k.getenv("TOPIC"))
	}
	switch {
	case k.spec == "":
		return k.usage("no key spec: pass --key-spec or set KEY")
	case k.topic == "" && k.file == "":
		return k.usage("nothing to sample: pass --topic or --file")
	case k.topic != "" && k.file != "":
		return k.usage("pass --topic or --file, not both")
	case k.limit < 0 || k.policy.MaxBytes < 0:
		return k.usage("--limit and --key-max-bytes must not be negative")
	}
	key, err := k.cli.Extractors.ParseKey(k.spec)
	if err != nil {
		return k.usage("--key-spec %q: %v", k.spec, err)
	}
	c := &keycheck.Checker{Key: key, Policy: k.policy}
	if k.timeSpec != "" {
		if c.EventTime, err = k.cli.Extractors.ParseTime(k.timeSpec); err != nil {
			return k.usage("--time-spec %q: %v", k.timeSpec, err)
		}
	}
	var from string
	if k.file != "" {
		from, err = k.readFile(c)
	} else {
		from, err = k.readBroker(ctx, c)
	}
	if err != nil {
		return err
	}
	rep := c.Report()
	if k.asJSON {
		if err := printJSON(k.stdout, rep); err != nil {
			return err
		}
	} else {
		k.print(rep, from)
	}
	if n := len(rep.Collisions); n > 0 {
		return fmt.Errorf("keys check: %d keys are shared by different payloads (collisions): key spec %q is not safe for this traffic", n, k.spec)
	}
	return nil
}

func (k *keysFlags) readBroker(ctx context.Context, c *keycheck.Checker) (string, error) {
	cfg, err := k.browseConfig(k.cli)
	if err != nil {
		return "", err
	}
	src, err := dlq.Open(ctx, cfg, dlq.Options{Destination: k.topic})
	if err != nil {
		return "", k.redactErr(fmt.Errorf("keys check: %w", err), k.redact)
	}
	defer func() { _ = src.Close() }()
	n := 0
	for k.limit == 0 || n < k.limit {
		max := 500
		if k.limit > 0 {
			max = min(max, k.limit-n)
		}
		batch, err := src.Next(ctx, max)
		for _, l := range batch {
			c.Add(l.Msg)
		}
		n += len(batch)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return "", k.redactErr(fmt.Errorf("keys check: %w", err), k.redact)
		}
	}
	kind := cmp.Or(map[string]string{"kafka": "Kafka topic", "nats": "NATS subject"}[cfg.Kind], "RabbitMQ queue")
	return fmt.Sprintf("%s %s (read without consuming)", kind, k.topic), nil
}

// keyFlags are the key spec and key policy of keys check and dlq.
type keyFlags struct {
	spec   string
	policy framework.KeyPolicy
}

// register adds --key-spec and the flags of whose key policy.
func (k *keyFlags) register(fs *flag.FlagSet, specHelp, whose string) {
	fs.StringVar(&k.spec, "key-spec", "", specHelp)
	fs.IntVar(&k.policy.MaxBytes, "key-max-bytes", 0, whose+"KeyPolicy.MaxBytes (default 512)")
	fs.BoolVar(&k.policy.HashOverlong, "key-hash-overlong", false, whose+"KeyPolicy.HashOverlong")
}

type fileMessage struct {
	ID            string            `json:"id"`
	UUID          string            `json:"uuid"`
	Metadata      map[string]string `json:"metadata"`
	Payload       *string           `json:"payload"`
	PayloadBase64 *string           `json:"payload_base64"`
}

func (k *keysFlags) readFile(c *keycheck.Checker) (string, error) {
	var r io.Reader = os.Stdin
	if k.file != "-" {
		f, err := os.Open(k.file)
		if err != nil {
			return "", fmt.Errorf("keys check: %w", err)
		}
		defer func() { _ = f.Close() }()
		r = f
	}
	sc := bufio.NewScanner(r)
	sc.Buffer(nil, 64<<20) // the JSON-key limit is 4 MiB of payload; base64 and metadata on top
	line, n := 0, 0
	for sc.Scan() && (k.limit == 0 || n < k.limit) {
		line++
		text := strings.TrimSpace(sc.Text())
		if text == "" {
			continue
		}
		var fm fileMessage
		if err := json.Unmarshal([]byte(text), &fm); err != nil {
			return "", k.usage("%s line %d: not a JSON object: %v", k.file, line, err)
		}
		var payload []byte
		switch {
		case fm.Payload != nil:
			payload = []byte(*fm.Payload)
		case fm.PayloadBase64 != nil:
			b, err := base64.StdEncoding.DecodeString(*fm.PayloadBase64)
			if err != nil {
				return "", k.usage("%s line %d: payload_base64: %v", k.file, line, err)
			}
			payload = b
		}
		id := cmp.Or(fm.ID, fm.UUID, fmt.Sprintf("line-%d", line))
		msg := message.NewMessage(id, payload)
		if fm.Metadata != nil {
			msg.Metadata = fm.Metadata
		}
		c.Add(msg)
		n++
	}
	if err := sc.Err(); err != nil {
		return "", fmt.Errorf("keys check: read %s: %w", k.file, err)
	}
	return "file " + k.file, nil
}

func (k *keysFlags) print(r keycheck.Report, from string) {
	w := k.stdout
	printf(w, "key spec %s over %d messages of %s\n", k.spec, r.Messages, from)
	printf(w, "  keyed %d, distinct keys %d, duplicates %d (same key, same payload: redeliveries, harmless)\n", r.Keyed, r.Keys, r.Duplicates)
	if q := r.KeyLength; q != nil {
		printf(w, "  key length in bytes: min %d, p50 %d, p90 %d, p99 %d, max %d (limit %d)\n",
			q.Min, q.P50, q.P90, q.P99, q.Max, cmp.Or(k.policy.MaxBytes, 512))
	}
	if len(r.Collisions) > 0 {
		printf(w, "COLLISIONS: %d keys are shared by different payloads: the later events would be acked as duplicates of the first and lost\n", len(r.Collisions))
		for _, c := range r.Collisions {
			var ps []string
			for fp, ids := range c.Payloads {
				ps = append(ps, fmt.Sprintf("%s… (%s)", fp[:12], strings.Join(ids, ", ")))
			}
			sort.Strings(ps)
			printf(w, "  %s: %d messages, %d payloads: %s\n", opfmt.OneLine(c.Key, 80), c.Messages, len(c.Payloads), strings.Join(ps, "; "))
		}
	}
	if len(r.Volatile) > 0 {
		printf(w, "volatile keys: %d payloads arrived under several keys: a key input that changes per copy (a trace id, a delivery id) makes every redelivery apply again, unless these are distinct events that happen to look alike\n", len(r.Volatile))
		for _, v := range r.Volatile {
			printf(w, "  payload %s…: keys %s (ids %s)\n", v.Fingerprint[:12], strings.Join(v.Keys, ", "), strings.Join(v.IDs, ", "))
		}
	}
	if len(r.Unkeyable) > 0 {
		printf(w, "unkeyable: %d messages (they would be poisoned)\n", r.Messages-r.Keyed)
		for _, u := range r.Unkeyable {
			printf(w, "  %d  %s (ids %s)\n", u.Messages, opfmt.OneLine(u.Reason, 120), strings.Join(u.IDs, ", "))
		}
	}
	if t := r.EventTime; t != nil {
		printf(w, "event time (%s): %d with", k.timeSpec, t.With)
		for reason, n := range t.Without {
			printf(w, "; %d without: %s", n, opfmt.OneLine(reason, 100))
		}
		if t.With > 0 {
			printf(w, "; earliest %s, latest %s, spread %s", t.Earliest.Format("2006-01-02T15:04:05Z07:00"), t.Latest.Format("2006-01-02T15:04:05Z07:00"), t.Spread)
		}
		printlnTo(w)
	}
	if len(r.Collisions) == 0 {
		printlnTo(w, "OK: no key is shared by different payloads")
	}
}
