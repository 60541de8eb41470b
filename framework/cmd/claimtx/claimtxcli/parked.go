package claimtxcli

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"math"
	"strings"
	"time"

	"github.com/claimtx/claimtx/framework/cmd/claimtx/internal/opfmt"
	"github.com/claimtx/claimtx/internal/pg"
)

// `claimtx parked`: the order keys parked by ordered effects
// (middleware.Claim.OrderKey). The commands only touch Postgres: retry and
// skip request a release, which the running consumer performs.

const parkedUsage = `Usage: claimtx parked SUBCOMMAND [flags]

  list    parked order keys, oldest first
  show    one key's parked messages, in order
  retry   ask the consumer to run a key's parked messages through the handler again, in order
  skip    ask the consumer to poison a key's head (with who and why), then retry the rest

Order keys parked by ordered effects (ORDER_KEY, docs/effects.md "Ordered effects"): a
message of the key failed for good, and it and every later message of the key wait in
Postgres. list and show read them; retry and skip only record a request, which the running
consumer performs within about a second.

Run "claimtx parked SUBCOMMAND -h" for a subcommand's flags and an example.
`

func init() {
	synopses["parked list"] = `List parked order keys, oldest first: consumer, key, parked messages, when and how long
ago the key parked, failed releases, the next release (a pending request and who made it,
an automatic one, or none until asked) and why the head last failed.

Example:
  claimtx parked list --consumer loyalty`
	synopses["parked show"] = `Show one parked order key and its parked messages in the order they will be applied:
id, dedup key, UUID, when parked, the head's reason, and the start of the payload.
--json prints the whole payload (base64) and the metadata.

Example:
  claimtx parked show --consumer loyalty --key customer-42 --json`
	synopses["parked retry"] = `Ask the running consumer to release an order key (--key) or every parked key of the
consumer (--all): the parked messages run through the handler in their order, each under
its claim, and the first that still fails keeps the key parked. Fails when --key is not
parked.

Example:
  claimtx parked retry --consumer loyalty --all --note "total_cents parser fixed in 1.4.2"`
	synopses["parked skip"] = `As retry, but the head is first sent to the poison destination with who asked (--by,
default $USER) and why (--note, required); the rest of the key are retried after it.

Example:
  claimtx parked skip --consumer loyalty --key customer-42 --note "order 9912 was cancelled upstream"`
}

// previewBytes bounds a payload shown in text.
const previewBytes = 120

// payloadPreview is a payload on one table line: text, or base64 when it is
// not UTF-8, of at most previewBytes of it.
func payloadPreview(b []byte) string {
	s, cut := opfmt.Payload(b, previewBytes)
	s = opfmt.OneLine(s, 2*previewBytes) // base64 of previewBytes stays within it: only whitespace is squeezed
	if cut {
		s += fmt.Sprintf(" … (%d bytes)", len(b))
	}
	return s
}

func cmdParked(ctx context.Context, args []string, stdout, _ io.Writer, getenv env, _ Config) error {
	sub, rest, err := subcommand("parked", parkedUsage, args, stdout, "list", "show", "retry", "skip")
	if err != nil {
		return err
	}
	name := "parked " + sub
	fs, c := newFlags(name, stdout, getenv)
	consumer := fs.String("consumer", "", "the `consumer` name")
	asJSON := fs.Bool("json", false, "print JSON")
	var key *string
	if sub != "list" {
		key = fs.String("key", "", "the order `key`")
	}
	var limit *int
	var all *bool
	var by, note *string
	if sub == "list" || sub == "show" {
		limit = fs.Int("limit", 100, "at most this many rows")
	} else {
		// --all is every key, so no --limit: a bound would leave keys parked
		// while the count printed looked complete.
		all = fs.Bool("all", false, "every parked key of the consumer")
		by = fs.String("by", cmp.Or(getenv("USER"), "claimtx"), "who asks (recorded with the request)")
		note = fs.String("note", "", "why (recorded; required by skip, stamped on the poisoned head)")
	}
	if err := c.parse(fs, rest); err != nil {
		return err
	}
	switch {
	case limit != nil && *limit < 1:
		return &usageError{msg: name + ": --limit must be positive"}
	case sub != "list":
		if err := requireConsumer(name, *consumer); err != nil {
			return err
		}
	}
	switch {
	case sub == "show" && *key == "":
		return &usageError{msg: name + ": --key is required"}
	case all != nil && (*key == "") == !*all:
		return &usageError{msg: name + ": give --key or --all"}
	case sub == "skip" && strings.TrimSpace(*note) == "":
		return &usageError{msg: name + ": --note is required: the poisoned head carries why it was skipped"}
	}
	st, closePool, err := c.connect(ctx)
	if err != nil {
		return err
	}
	defer closePool()
	parking := pg.ParkingOf(st)
	switch sub {
	case "list":
		keys, err := parking.Keys(ctx, *consumer, *limit)
		if err != nil {
			return c.fail(ctx, name, err)
		}
		if *asJSON {
			return printJSON(stdout, nonNil(keys))
		}
		printKeys(stdout, keys)
		return nil
	case "show":
		k, ok, err := parking.Key(ctx, *consumer, *key)
		if err != nil {
			return c.fail(ctx, name, err)
		}
		if !ok {
			return notParked(*consumer, *key)
		}
		ms, err := parking.Messages(ctx, *consumer, *key, *limit)
		if err != nil {
			return c.fail(ctx, name, err)
		}
		if *asJSON {
			return printJSON(stdout, struct {
				Key      pg.ParkedKey       `json:"key"`
				Messages []pg.ParkedMessage `json:"messages"`
			}{k, nonNil(ms)})
		}
		printKeys(stdout, []pg.ParkedKey{k})
		tw := newTable(stdout)
		printlnTo(tw, "ID\tDEDUP KEY\tUUID\tPARKED\tREASON\tPAYLOAD")
		for _, m := range ms {
			printf(tw, "%d\t%s\t%s\t%s\t%s\t%s\n", m.ID, opfmt.OneLine(m.Key, 60), opfmt.OneLine(m.UUID, 40), m.ParkedAt.UTC().Format(time.RFC3339), opfmt.OneLine(cmp.Or(m.Reason, "(behind the head)"), 80), payloadPreview(m.Payload))
		}
		return tw.Flush()
	}
	keys := []string{*key}
	if *all {
		ks, err := parking.Keys(ctx, *consumer, math.MaxInt32)
		if err != nil {
			return c.fail(ctx, name, err)
		}
		keys = keys[:0]
		for _, k := range ks {
			keys = append(keys, k.OrderKey)
		}
	}
	var requested []string
	for _, k := range keys {
		ok, err := parking.Request(ctx, *consumer, k, sub == "skip", *by, *note)
		if err != nil {
			return c.fail(ctx, name, err)
		}
		if !ok && !*all {
			return notParked(*consumer, k)
		}
		if ok {
			requested = append(requested, k)
		}
	}
	if *asJSON {
		return printJSON(stdout, struct {
			Consumer  string   `json:"consumer"`
			Skip      bool     `json:"skip"`
			Requested []string `json:"requested"`
		}{*consumer, sub == "skip", nonNil(requested)})
	}
	printf(stdout, "requested a %s of %d parked order keys of consumer %s; the running consumer releases them within about a second (claimtx parked list shows what is left)\n",
		sub, len(requested), *consumer)
	return nil
}

// notParked is the error of a key that is not parked.
func notParked(consumer, key string) error {
	return fmt.Errorf("order key %q of consumer %q is not parked", key, consumer)
}

func printKeys(w io.Writer, keys []pg.ParkedKey) {
	if len(keys) == 0 {
		printlnTo(w, "no parked order keys")
		return
	}
	tw := newTable(w)
	printlnTo(tw, "CONSUMER\tORDER KEY\tMESSAGES\tPARKED\tAGE\tFAILURES\tRELEASE\tREASON")
	now := time.Now()
	for _, k := range keys {
		printf(tw, "%s\t%s\t%d\t%s\t%s\t%d\t%s\t%s\n", k.Consumer, opfmt.OneLine(k.OrderKey, 60), k.Messages, k.ParkedAt.UTC().Format(time.RFC3339),
			opfmt.Age(now.Sub(k.ParkedAt)), k.Failures, opfmt.Release(k, now), opfmt.OneLine(k.Reason, 100))
	}
	_ = tw.Flush()
}

// nonNil makes an empty list print as [] in JSON.
func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}
