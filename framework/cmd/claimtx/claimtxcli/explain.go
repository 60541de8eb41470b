package claimtxcli

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/framework/cmd/claimtx/internal/dlq"
	"github.com/claimtx/claimtx/framework/cmd/claimtx/internal/explain"
	"github.com/claimtx/claimtx/internal/pg"
	"github.com/claimtx/claimtx/store"
)

func init() {
	synopses["explain"] = `Explain one message of a consumer: its claim (when, event day and partition, whether a payload fingerprint was stored), the transaction that wrote the claim, the outbox rows written in that transaction with their publish status (sent, pending, failing), and its poison memo. The message is named by --key, or by --message, a JSON file {"metadata": {...}, "payload": ...} from which --key-spec derives the key (a string payload is taken as its text, any other JSON value as itself).

Exit status: 0 when a claim or a poison memo exists, 1 when neither does (or the command failed; both say why on stderr), 2 on bad input.

Examples:
  claimtx explain --consumer loyalty --key order-completed:9912
  claimtx explain --consumer loyalty --message order.json --key-spec 'template:order-completed:{payload.order_id}' --json`
}

var errNotFound = errors.New("nothing found")

func cmdExplain(ctx context.Context, args []string, stdout, _ io.Writer, getenv env, cli Config) error {
	fs, c := newFlags("explain", stdout, getenv)
	consumer := fs.String("consumer", "", "the `consumer` name (required)")
	key := fs.String("key", "", "the message `key`")
	msgFile := fs.String("message", "", "a JSON message `file` {\"metadata\": {...}, \"payload\": ...} to derive the key from with --key-spec (\"-\": stdin)")
	keySpec := fs.String("key-spec", "", "the consumer's key `spec`, for --message (e.g. metadata:event_id)")
	outbox := fs.String("outbox-table", "", "outbox `table` (env CLAIMTX_OUTBOX_TABLE; default outbox)")
	asJSON := fs.Bool("json", false, "print JSON")
	if err := c.parse(fs, args); err != nil {
		return err
	}
	if err := requireConsumer("explain", *consumer); err != nil {
		return err
	}
	switch {
	case *key != "" && *msgFile != "":
		return &usageError{msg: "explain: give --key or --message, not both"}
	case *key == "" && *msgFile == "":
		return &usageError{msg: "explain: give --key, or --message with --key-spec"}
	case *msgFile != "" && *keySpec == "":
		return &usageError{msg: "explain: --message needs --key-spec, the key spec the consumer derives keys with"}
	case *msgFile == "" && *keySpec != "":
		return &usageError{msg: "explain: --key-spec is for --message"}
	}
	if *msgFile != "" {
		k, err := keyFromFile(cli.Extractors, *msgFile, *keySpec)
		if err != nil {
			return err
		}
		*key = k
	}
	*outbox = cmp.Or(*outbox, getenv("CLAIMTX_OUTBOX_TABLE"), pg.DefaultOutboxTable)
	if err := (store.Config{OutboxTable: *outbox}).Validate(); err != nil {
		return &usageError{msg: "explain: --outbox-table: " + err.Error()}
	}
	st, closePool, err := c.connect(ctx)
	if err != nil {
		return err
	}
	defer closePool()
	cfg := st.Config()
	rep, err := explain.Explain(ctx, c.pool, pg.NewNames(cfg.Schema, cfg.ClaimsTable, *outbox), *consumer, *key)
	if err != nil {
		return c.fail(ctx, "explain", err)
	}
	if *asJSON {
		if err := printJSON(stdout, rep); err != nil {
			return err
		}
	} else {
		printReport(stdout, rep)
	}
	if !rep.Found() {
		return &redactedError{msg: fmt.Sprintf("explain: no claim and no poison memo for consumer %s, key %q in %s.%s", *consumer, *key, cfg.Schema, cfg.ClaimsTable), err: errNotFound}
	}
	return nil
}

// keyFromFile derives the key of the message in file as the consumer does
// (with the default KeyPolicy).
func keyFromFile(reg *framework.Registry, file, spec string) (string, error) {
	kf, err := reg.ParseKey(spec)
	if err != nil {
		return "", &usageError{msg: "explain: --key-spec: " + err.Error()}
	}
	var raw []byte
	if file == "-" {
		raw, err = io.ReadAll(os.Stdin)
	} else {
		raw, err = os.ReadFile(file) //nolint:gosec // the operator names the message file to explain
	}
	if err != nil {
		return "", &usageError{msg: fmt.Sprintf("explain: --message: %v", err)}
	}
	var m struct {
		Metadata map[string]string `json:"metadata"`
		Payload  json.RawMessage   `json:"payload"`
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&m); err != nil {
		return "", &usageError{msg: fmt.Sprintf(`explain: --message %s: want a JSON object {"metadata": {"name": "value", ...}, "payload": ...}: %v`, file, err)}
	}
	payload := []byte(m.Payload)
	if len(payload) > 0 && payload[0] == '"' {
		var s string
		if err := json.Unmarshal(payload, &s); err != nil {
			return "", &usageError{msg: fmt.Sprintf("explain: --message %s: payload: %v", file, err)}
		}
		payload = []byte(s)
	}
	msg := message.NewMessage("", payload)
	for k, v := range m.Metadata {
		msg.Metadata.Set(k, v)
	}
	key, err := dlq.DeriveKey(kf, framework.KeyPolicy{}, msg)
	if err != nil {
		return "", &usageError{msg: fmt.Sprintf("explain: --message %s: no key with --key-spec %s: %v", file, spec, err)}
	}
	return key, nil
}

func printReport(w io.Writer, r explain.Report) {
	printf(w, "consumer %s, key %q\n", r.Consumer, r.Key)
	if r.Claim == nil {
		printlnTo(w, "claim:        none (never applied by this consumer, or removed by retention)")
	} else {
		cl := r.Claim
		fp := "no payload fingerprint"
		if cl.Fingerprint {
			fp = "payload fingerprint stored"
		}
		printf(w, "claim:        applied %s; %s\n", cl.ProcessedAt.UTC().Format(time.RFC3339Nano), fp)
		if cl.EventDay != nil || cl.Partition != "" {
			day := "none"
			if cl.EventDay != nil {
				day = cl.EventDay.Format(time.DateOnly)
			}
			printf(w, "              event day %s, partition %s\n", day, cmp.Or(cl.Partition, "-"))
		}
		if cl.Transaction == nil {
			printlnTo(w, "transaction:  unknown (claimed before claimtx recorded transaction ids: schema migration 5)")
		} else {
			printf(w, "transaction:  %s\n", strconv.FormatUint(*cl.Transaction, 10))
			if len(r.Outbox) == 0 {
				printlnTo(w, "outbox:       no rows written in that transaction (or removed by the outbox retention)")
			} else {
				printf(w, "outbox:       %d rows written in that transaction\n", len(r.Outbox))
				tw := newTable(w)
				printlnTo(tw, "  ID\tTOPIC\tCREATED\tSTATUS\tSENT\tATTEMPTS\tLAST ERROR")
				for _, o := range r.Outbox {
					sent := "-"
					if o.SentAt != nil {
						sent = o.SentAt.UTC().Format(time.RFC3339)
					}
					printf(tw, "  %d\t%s\t%s\t%s\t%s\t%d\t%s\n", o.ID, o.Topic, o.CreatedAt.UTC().Format(time.RFC3339), o.Status, sent, o.Attempts, cmp.Or(o.LastError, "-"))
				}
				_ = tw.Flush()
			}
		}
	}
	if r.Memo == nil {
		printlnTo(w, "poison memo:  none")
		return
	}
	times := "times"
	if r.Memo.Seen == 1 {
		times = "time"
	}
	printf(w, "poison memo:  poisoned %d %s, last %s: %s\n", r.Memo.Seen, times, r.Memo.PoisonedAt.UTC().Format(time.RFC3339), r.Memo.Reason)
	printf(w, "              later copies go straight to the poison destination; clear it with `claimtx unpoison --consumer %s --key %s`\n", shellQuote(r.Consumer), shellQuote(r.Key))
}

func shellQuote(s string) string {
	safe := s != ""
	for _, r := range s {
		if (r < 'a' || r > 'z') && (r < 'A' || r > 'Z') && (r < '0' || r > '9') && !strings.ContainsRune("-_:./@=,+", r) {
			safe = false
			break
		}
	}
	if safe {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
