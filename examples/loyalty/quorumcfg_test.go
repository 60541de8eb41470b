package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"
)

// quorumArgs are the arguments brokers/amqp declares for a quorum queue
// with delivery limit limit (0: none).
func quorumArgs(limit int) amqp.Table {
	args := amqp.Table{"x-queue-type": "quorum"}
	if limit > 0 {
		args["x-delivery-limit"] = int64(limit)
	}
	return args
}

// redeclareQueue declares queue with args on a channel of its own and
// returns RabbitMQ's answer (nil: the queue has these arguments).
func (h *harness) redeclareQueue(queue string, args amqp.Table) error {
	h.t.Helper()
	ch, err := h.amqp().Channel()
	require.NoError(h.t, err)
	_, err = ch.QueueDeclare(queue, true, false, false, false, args)
	if err == nil {
		_ = ch.Close()
	}
	return err
}

// asQuorum replaces the harness's (empty) classic queue by a quorum queue
// with delivery limit limit, or by nothing when limit < 0, and makes the
// consumers it starts use quorum queues.
func (h *harness) asQuorum(limit int) {
	h.t.Helper()
	ch, err := h.amqp().Channel()
	require.NoError(h.t, err)
	_, err = ch.QueueDelete(h.topic, false, false, false)
	require.NoError(h.t, err)
	require.NoError(h.t, ch.Close())
	if limit >= 0 {
		require.NoError(h.t, h.redeclareQueue(h.topic, quorumArgs(limit)))
	}
	h.extraEnv = append(h.extraEnv, "AMQP_QUEUE_TYPE=quorum")
	if limit > 0 {
		h.extraEnv = append(h.extraEnv, fmt.Sprintf("AMQP_DELIVERY_LIMIT=%d", limit))
	}
}

// TestQuorumQueues runs the loyalty example on RabbitMQ quorum queues,
// selected by AMQP_QUEUE_TYPE (and AMQP_DELIVERY_LIMIT): a consumer killed
// after its commit and before its ack has the redelivery acked as a
// duplicate, two competing consumers take every order three times over
// with exact balances, bad messages go, with their reasons, to a poison
// queue that is a quorum queue too.
func TestQuorumQueues(t *testing.T) {
	t.Parallel()
	h := newHarness(t, "amqp")
	h.asQuorum(20)

	crash := orders(1, 5)
	p := h.start("LOYALTY_CRASH_AFTER_COMMIT=3", "CONCURRENCY=1")
	h.publish(crash...)
	require.True(t, p.exited(60*time.Second), "the consumer should have killed itself after committing order 3")
	p2 := h.start("LOG_LEVEL=debug")
	p2.waitLog(t, `msg="loyalty: outcome" order_id=3 outcome=duplicate`)
	h.start() // a competitor, from now on

	more := orders(6, 100)
	for range 3 {
		h.publish(more...)
	}
	bad := []string{`{"order_id": `, `{"customer_id": 1, "total_cents": 100}`}
	h.publishRaw([]string{"bad-json", "bad-nokey"}, [][]byte{[]byte(bad[0]), []byte(bad[1])})
	all := append(crash, more...)
	h.waitApplied(len(all))
	ps := h.poisoned(len(bad))
	for _, m := range ps {
		require.NotEmpty(t, m.headers["claimtx_poison_reason"], "poisoned with the reason")
	}
	h.waitFor("claims", func() bool {
		return h.tryCount(fmt.Sprintf(`SELECT count(*) FROM %q.processed_messages`, h.schema)) == len(all)
	})
	h.assertExact(all)
	require.NoError(t, h.redeclareQueue(h.topic+".poison", quorumArgs(20)), "the poison queue is a quorum queue with the same arguments")
	require.Error(t, h.redeclareQueue(h.topic, nil), "the topic's queue is not classic")
}

// TestQueueTypeMismatchStopsTheConsumer: AMQP_QUEUE_TYPE=quorum against
// an existing classic queue stops the consumer at once with an error that
// names the setting and says how to migrate.
func TestQueueTypeMismatchStopsTheConsumer(t *testing.T) {
	t.Parallel()
	h := newHarness(t, "amqp") // its queue is classic
	p := h.start("AMQP_QUEUE_TYPE=quorum", "STARTUP_TIMEOUT=-1s")
	require.True(t, p.exited(30*time.Second), "the consumer must stop")
	var exit *exec.ExitError
	require.ErrorAs(t, p.err, &exit)
	out := p.out.String()
	require.Contains(t, out, `config field \"queue_type\"`)
	require.Contains(t, out, "rabbitmqctl delete_queue "+h.topic)
	require.Contains(t, out, "PRECONDITION_FAILED")
}

// loyaltyEnv is a minimal environment for the binary: nothing of the
// test runner's configuration leaks in.
func loyaltyEnv(extra ...string) []string {
	return append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME"), "METRICS_ADDR=off"}, extra...)
}

// TestConfigFile runs the consumer from one YAML file (CONFIG_FILE): the
// broker section (quorum queues), the store, the handler retries and the
// topic come from it, the topic is overridden by TOPIC, the database URL
// with its password comes from DATABASE_URL_FILE, and the configuration
// logged at debug level shows no password.
func TestConfigFile(t *testing.T) {
	t.Parallel()
	h := newHarness(t, "amqp")
	h.asQuorum(-1) // the consumer declares it
	const pgPass = "PgFilePw-secret"
	dbURL := strings.Replace(h.dbURL, "postgres://postgres@", "postgres://postgres:"+pgPass+"@", 1)
	require.Contains(t, dbURL, pgPass, "trust authentication ignores the password")
	dir := t.TempDir()
	dbFile := filepath.Join(dir, "database-url")
	require.NoError(t, os.WriteFile(dbFile, []byte(dbURL+"\n"), 0o600))
	cfgFile := filepath.Join(dir, "loyalty.yaml")
	require.NoError(t, os.WriteFile(cfgFile, []byte(fmt.Sprintf(`# the test's configuration
topic: not-this-one
store:
  schema: %s
handler:
  retries: 1
broker:
  kind: amqp
  amqp:
    url: %q
    queue_type: quorum
    concurrency: 2
`, h.schema, h.amqpURL)), 0o600))

	p := startProc(t, loyaltyEnv("CONFIG_FILE="+cfgFile, "DATABASE_URL_FILE="+dbFile, "TOPIC="+h.topic, "LOG_LEVEL=debug"))
	p.waitLog(t, `msg="loyalty: consuming"`)
	good := orders(1, 20)
	h.publish(good...)
	h.publishRaw([]string{"bad"}, [][]byte{[]byte("not json")})
	h.waitApplied(len(good))
	h.poisoned(1)
	h.assertExact(good)
	p.stop()
	require.NoError(t, p.err, "SIGTERM ends it cleanly")

	out := p.out.String()
	require.Contains(t, out, "loyalty: configuration file")
	require.Contains(t, out, `msg="loyalty: configuration"`, "the effective configuration is logged at debug level")
	require.Contains(t, out, "postgres:xxxxx@", "with the password redacted")
	require.NotContains(t, out, pgPass)
	require.NotContains(t, out, "not-this-one", "TOPIC overrides the file")
	require.NoError(t, h.redeclareQueue(h.topic, quorumArgs(0)), "the file's queue_type reached the broker")
	require.NoError(t, h.redeclareQueue(h.topic+".poison", quorumArgs(0)))
}

// TestConfigFileErrors: a mistake in the file stops the consumer before
// it connects anywhere, naming the key's path (and line); the documented
// example is accepted (the consumer gets as far as the database, which is
// unreachable here on purpose).
func TestConfigFileErrors(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	unreachable := "DATABASE_URL=postgres://postgres@127.0.0.1:1/none?sslmode=disable&connect_timeout=1"
	for _, tc := range []struct {
		name, yaml string
		env        []string
		want       string
	}{
		{"unknown key", "claim:\n  max_claim_wai: 5s\n", nil, `field \"claim.max_claim_wai\": unknown key (line 2)`},
		{"bad value", "claim:\n  isolation: chaos\n", nil, `field \"claim.isolation\"`},
		{"bad broker value", "broker:\n  amqp:\n    delivery_limit: 3\n", nil, `field \"broker.amqp.delivery_limit\"`},
		{"unknown broker key", "broker:\n  amqp:\n    queue_typ: quorum\n", nil, `field \"broker.amqp.queue_typ\"`},
		{"bad key spec", "key: \"jsn:order_id\"\n", nil, `field \"key\"`},
		{"bad key spec from the environment", "key: \"json:order_id\"\n", []string{"KEY=jsn:order_id"}, `field \"KEY\"`},
		{"bad event time spec", "event_time: \"wall:clock\"\n", nil, `field \"event_time\"`},
		{"retention without event time", "retention: 720h\n", nil, `field \"event_time\"`},
		{"bad schema", "store:\n  schema: Not-A-Schema\n", nil, `field \"store.schema\"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			path := filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "-")+".yaml")
			require.NoError(t, os.WriteFile(path, []byte(tc.yaml), 0o600))
			out, exitErr := runLoyalty(t, append([]string{"CONFIG_FILE=" + path, unreachable, "STARTUP_TIMEOUT=-1s", "AMQP_DIAL_TIMEOUT=-1s"}, tc.env...)...)
			require.Error(t, exitErr, "loyalty must exit with an error; output:\n%s", out)
			require.Contains(t, out, tc.want, "output:\n%s", out)
			require.NotContains(t, out, "start-up:", "refused before connecting; output:\n%s", out)
		})
	}
	t.Run("the example is accepted", func(t *testing.T) {
		t.Parallel()
		out, exitErr := runLoyalty(t, "CONFIG_FILE=config.example.yaml", unreachable, "STARTUP_TIMEOUT=-1s")
		require.Error(t, exitErr)
		require.Contains(t, out, "claimtx: start-up: PostgreSQL", "it got as far as the database; output:\n%s", out)
		require.NotContains(t, out, "config field", "output:\n%s", out)
	})
}

// runLoyalty runs the binary to its end with a minimal environment and
// returns its output and exit error.
func runLoyalty(t *testing.T, env ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, loyaltyBin)
	cmd.Env = loyaltyEnv(env...)
	out, err := cmd.CombinedOutput()
	require.False(t, errors.Is(ctx.Err(), context.DeadlineExceeded), "loyalty did not stop; output:\n%s", out)
	return string(out), err
}
