package claimtxcli

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/brokers"
	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/framework/cmd/claimtx/internal/dlq"
	"github.com/claimtx/claimtx/framework/cmd/claimtx/internal/dlq/dlqtest"
)

// tenantSpec names the extractor of inventoryExtractors: the tenant
// header and a payload field, which no built-in spec joins.
const tenantSpec = "tenant_idem:order_id"

// inventoryExtractors is the registry of a consumer with its own key
// extractor, tenant_idem:FIELD ("TENANT/FIELD"), and event-time
// extractor, epoch:FIELD (FIELD as Unix seconds).
func inventoryExtractors(t *testing.T) *framework.Registry {
	t.Helper()
	reg := framework.NewRegistry()
	require.NoError(t, reg.RegisterKey("tenant_idem", func(arg string) (framework.KeyFunc, error) {
		field, err := framework.ParseKeySpec("json:" + arg)
		if err != nil {
			return nil, err
		}
		return func(m *message.Message) (string, error) {
			id, err := field(m)
			if err != nil {
				return "", err
			}
			if m.Metadata.Get("tenant") == "" {
				return "", &framework.KeyError{Source: "metadata tenant", Reason: "field is missing"}
			}
			return m.Metadata.Get("tenant") + "/" + id, nil
		}, nil
	}))
	require.NoError(t, reg.RegisterTime("epoch", func(arg string) (framework.TimeFunc, error) {
		field, err := framework.ParseKeySpec("json:" + arg)
		if err != nil {
			return nil, err
		}
		return func(m *message.Message) (time.Time, error) {
			s, err := field(m)
			if err != nil {
				return time.Time{}, &framework.EventTimeError{Source: "epoch " + arg, Reason: err.Error()}
			}
			n, err := strconv.ParseInt(s, 10, 64)
			return time.Unix(n, 0), err
		}, nil
	}))
	return reg
}

// tenantWorld is a RabbitMQ world (or one of kind) whose consumer
// "inventory" poisoned the orders 1 to 6 of tenant acme and an order 7
// without a tenant; acme/1 is already applied.
func tenantWorld(t *testing.T, kind ...string) *dlqtest.World {
	t.Helper()
	w := dlqtest.New(t, append(kind, brokers.KindAMQP)[0], 1)
	orders := dlqtest.Orders(1, 7)
	for _, o := range orders[:6] {
		o.Metadata.Set("tenant", "acme")
	}
	w.Publish(w.Poison, w.Poisoned("inventory", dlqKeySpec, errors.New("stock service down"), orders...)...)
	w.Claim("inventory", "acme/1", dlq.Fingerprint(orders[0].Payload))
	return w
}

// A program embedding the CLI with its registry classifies, replays,
// checks and looks up with its own extractors, in every command that
// parses a spec.
func TestEmbeddedCLIOwnExtractors(t *testing.T) {
	t.Parallel()
	w := tenantWorld(t)
	c, broker := dlqCLI(t, w)
	c.cfg = Config{Extractors: inventoryExtractors(t)}
	args := func(a ...string) []string { return append(append([]string{"dlq"}, a...), broker...) }

	listInspectReplay(t, c, args, w)

	// The RabbitMQ sample is what the replay left in the poison queue: the
	// applied order 1 and the order 7 without a tenant.
	out := c.ok("keys", "check", "--key-spec", tenantSpec, "--time-spec", "epoch:order_id", "--topic", w.Poison, "--broker", "amqp", "--amqp-url", dlqtest.AMQPURL)
	require.Contains(t, out, "key spec "+tenantSpec+" over 2 messages of RabbitMQ queue "+w.Poison)
	require.Contains(t, out, "keyed 1, distinct keys 1")
	require.Contains(t, out, "unkeyable: 1 messages")
	require.Contains(t, out, "event time (epoch:order_id): 2 with")
	file := filepath.Join(t.TempDir(), "sample.jsonl")
	require.NoError(t, os.WriteFile(file, []byte(`{"id": "a", "metadata": {"tenant": "acme"}, "payload": "{\"order_id\": 1}"}`+"\n"), 0o600))
	out = c.ok("keys", "check", "--key-spec", tenantSpec, "--time-spec", "epoch:order_id", "--file", file)
	require.Contains(t, out, "keyed 1, distinct keys 1")
	require.Contains(t, out, "event time (epoch:order_id): 1 with; earliest 1970-01-01T00:00:01Z")

	msg := filepath.Join(t.TempDir(), "msg.json")
	require.NoError(t, os.WriteFile(msg, []byte(`{"metadata": {"tenant": "acme"}, "payload": {"order_id": 1}}`), 0o600))
	out = c.ok("explain", "--consumer", "inventory", "--message", msg, "--key-spec", tenantSpec)
	require.Contains(t, out, `consumer inventory, key "acme/1"`)
	require.Contains(t, out, "payload fingerprint stored")
}

// The console of an embedding program starts with a consumer
// configuration naming its extractor, classifies the dead letters with it
// and derives a pasted message's key with it.
func TestEmbeddedCLIConsoleOwnExtractors(t *testing.T) {
	t.Parallel()
	w := tenantWorld(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	con := startConsole(ctx, t, Config{Extractors: inventoryExtractors(t)}, "--consumer-config", consumerConfig(t, w, "inventory", tenantSpec, ""))

	body := con.get("/dead-letters?consumer=inventory")
	require.Contains(t, body, `<table id="letters">`)
	classes := map[string]string{}
	for _, m := range regexp.MustCompile(`(?s)<tr data-id="([^"]*)">.*?data-class="([^"]*)"`).FindAllStringSubmatch(body, -1) {
		classes[m[1]] = m[2]
	}
	require.Equal(t, map[string]string{
		"order-1": "already-applied", "order-2": "would-apply", "order-3": "would-apply", "order-4": "would-apply",
		"order-5": "would-apply", "order-6": "would-apply", "order-7": "still-bad",
	}, classes)
	require.Contains(t, body, "acme/4")

	lookupAcme1(t, con)
}

// The claimtx binary knows the built-in extractors only, and says so in
// the terms of the flag or file that named another, once, on one line.
func TestStockCLIRefusesOwnExtractor(t *testing.T) {
	t.Parallel()
	w := tenantWorld(t)
	c, broker := dlqCLI(t, w)
	unknown := `unknown key extractor "tenant_idem" in spec "tenant_idem:order_id" (known: first, json, metadata, template)`
	msg := filepath.Join(t.TempDir(), "msg.json")
	require.NoError(t, os.WriteFile(msg, []byte(`{"metadata": {"tenant": "acme"}, "payload": {"order_id": 1}}`), 0o600))
	c.refuses([]usageCase{
		{append([]string{"dlq", "list", "--consumer", "inventory", "--key-spec", tenantSpec}, broker...), `--key-spec "tenant_idem:order_id": config field "key": ` + unknown},
		{[]string{"keys", "check", "--key-spec", tenantSpec, "--file", msg}, unknown},
		{[]string{"keys", "check", "--key-spec", "json:order_id", "--time-spec", "epoch:order_id", "--file", msg}, `unknown event time extractor "epoch"`},
		{[]string{"explain", "--consumer", "inventory", "--message", msg, "--key-spec", tenantSpec}, unknown},
	})
	file := consumerConfig(t, w, "inventory", tenantSpec, "")
	code, out, errOut := c.run("console", "--listen", "127.0.0.1:0", "--consumer-config", file)
	require.Equal(t, exitUsage, code, out)
	require.Equal(t, "claimtx: console: --consumer-config "+file+`: config field "key": `+unknown+"\n", errOut)
}

// inhouseKind is an adapter of the tests' own: RabbitMQ under another
// kind name, its URL in options (as a company's wrapper of a built-in
// adapter would carry its own settings).
const inhouseKind = "inhouse-amqp"

var registerInhouse = sync.OnceFunc(func() {
	amqpOf := func(c brokers.Config) brokers.Config {
		return brokers.Config{Kind: brokers.KindAMQP, AMQP: brokers.AMQPConfig{URL: c.Options["url"]}}
	}
	brokers.Register(inhouseKind, brokers.Factory{
		NewSubscriber: func(c brokers.Config, l watermill.LoggerAdapter) (message.Subscriber, error) {
			return brokers.NewSubscriber(amqpOf(c), l)
		},
		NewPublisher: func(c brokers.Config, l watermill.LoggerAdapter) (message.Publisher, error) {
			return brokers.NewPublisher(amqpOf(c), l)
		},
	})
	inhouseBrowse = func(c brokers.Config) (brokers.Config, error) { return amqpOf(c), nil }
})

// inhouseBrowse is the BrowseAs of inhouseKind, set by registerInhouse.
var inhouseBrowse func(brokers.Config) (brokers.Config, error)

// A registered kind is browsed as the built-in configuration BrowseAs
// gives for it, in dlq, keys check and the console; without it, dlq
// refuses the kind.
func TestEmbeddedCLIBrowseAs(t *testing.T) {
	t.Parallel()
	registerInhouse()
	w := tenantWorld(t)
	inhouse := fmt.Sprintf("{kind: %s, options: {url: %q}}", inhouseKind, dlqtest.AMQPURL)
	brokerFile := filepath.Join(t.TempDir(), "broker.yaml")
	require.NoError(t, os.WriteFile(brokerFile, []byte(inhouse), 0o600))
	c, _ := dlqCLI(t, w)
	c.cfg.Extractors = inventoryExtractors(t)
	list := []string{"dlq", "list", "--topic", w.Topic, "--broker-config", brokerFile, "--consumer", "inventory", "--key-spec", tenantSpec, "--json"}

	code, out, errOut := c.run(list...)
	require.Equal(t, exitUsage, code, out)
	require.Contains(t, errOut, `"inhouse-amqp": dead letters can be browsed on`)

	c.cfg.BrowseAs = map[string]func(brokers.Config) (brokers.Config, error){inhouseKind: inhouseBrowse}
	rows := jsonLines(t, c.ok(list...))
	require.Len(t, rows, 7)
	require.Equal(t, "acme/2", rows[1]["key"])
	out = c.ok("dlq", "replay", "--topic", w.Topic, "--broker-config", brokerFile, "--consumer", "inventory", "--key-spec", tenantSpec)
	require.Contains(t, out, "5 replayed to "+w.Topic)
	require.Len(t, w.Read(w.Topic), 5)
	out = c.ok("keys", "check", "--key-spec", tenantSpec, "--topic", w.Poison, "--broker-config", brokerFile)
	require.Contains(t, out, "over 2 messages of RabbitMQ queue "+w.Poison)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	con := startConsole(ctx, t, c.cfg, "--consumer-config", consumerConfig(t, w, "inventory", tenantSpec, inhouse))
	body := con.get("/dead-letters?consumer=inventory")
	require.Contains(t, body, `<tr data-id="order-7">`)
	require.Contains(t, body, "acme/1")
}

// The user: a custom extractor on NATS lists, classifies and
// replays a dead letter, and looks a key up in the console.
func TestEmbeddedCLIOwnExtractorsNATS(t *testing.T) {
	t.Parallel()
	w := tenantWorld(t, brokers.KindNATS)
	c, broker := dlqCLI(t, w)
	c.cfg = Config{Extractors: inventoryExtractors(t)}
	args := func(a ...string) []string { return append(append([]string{"dlq"}, a...), broker...) }

	listInspectReplay(t, c, args, w)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	con := startConsole(ctx, t, Config{Extractors: inventoryExtractors(t)}, "--consumer-config",
		consumerConfig(t, w, "inventory", tenantSpec, "{kind: nats}"))
	body := con.get("/dead-letters?consumer=inventory")
	require.Contains(t, body, `<table id="letters">`)
	require.Contains(t, body, "acme/1", "the applied letter the replay left, keyed by the custom extractor")
	lookupAcme1(t, con)
}

// listInspectReplay lists a tenantWorld's letters with the custom key,
// inspects one and replays the five that would apply.
func listInspectReplay(t *testing.T, c *cli, args func(...string) []string, w *dlqtest.World) {
	t.Helper()
	rows := jsonLines(t, c.ok(args("list", "--json", "--consumer", "inventory", "--key-spec", tenantSpec)...))
	require.Len(t, rows, 7)
	require.Equal(t, "acme/1", rows[0]["key"])
	require.Equal(t, "already-applied", rows[0]["class"])
	require.Equal(t, "acme/2", rows[1]["key"])
	require.Equal(t, "would-apply", rows[1]["class"])
	require.Equal(t, "still-bad", rows[6]["class"])
	require.Contains(t, rows[6]["key_error"], "metadata tenant")

	out := c.ok(args("inspect", "--id", "order-3", "--consumer", "inventory", "--key-spec", tenantSpec)...)
	require.Contains(t, out, "acme/3")

	out = c.ok(args("replay", "--consumer", "inventory", "--key-spec", tenantSpec)...)
	require.Contains(t, out, "5 replayed to "+w.Topic)
	require.Len(t, w.Read(w.Topic), 5)
}

// lookupAcme1 pastes order 1 of tenant acme into the console's look-up:
// the custom extractor derives acme/1, whose claim the page shows.
func lookupAcme1(t *testing.T, con *runningConsole) {
	t.Helper()
	csrf := regexp.MustCompile(`name="csrf" value="([^"]+)"`).FindStringSubmatch(con.get("/lookup"))
	require.NotNil(t, csrf)
	status, page := con.post("/lookup", url.Values{"csrf": {csrf[1]}, "consumer": {"inventory"},
		"payload": {`{"order_id": 1}`}, "metadata": {"tenant: acme"}})
	require.Equal(t, http.StatusOK, status, page)
	require.Contains(t, page, `<code id="derived-key">acme/1</code>`)
	require.Contains(t, page, `id="claim"`)
}
