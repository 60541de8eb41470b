package main

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestConfigErrorsNameTheVariable starts the binary with one bad variable
// at a time, as an operator would set it: it must exit non-zero, and the
// error must name that variable, not the Go field or YAML path behind it.
// The database is unreachable on purpose: each of these is a mistake to
// report before connecting anywhere.
func TestConfigErrorsNameTheVariable(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		env       []string
		name, not string // the variable the error names; a name it must not use
	}{
		{[]string{"KEY=jsn:order_id"}, "KEY", `\"key\"`},
		{[]string{"CONCURRENCY=abc"}, "CONCURRENCY", "amqp.concurrency"},
		{[]string{"AMQP_URL=http://rabbit/"}, "AMQP_URL", "amqp.url"},
		{[]string{"BROKER=kafka", "KAFKA_BROKERS=nohost"}, "KAFKA_BROKERS", "kafka.brokers"},
		{[]string{"CLAIMTX_SCHEMA=Not-A-Schema"}, "CLAIMTX_SCHEMA", `\"Schema\"`},
		{[]string{"HANDLER_RETRIES=-1"}, "HANDLER_RETRIES", "HandlerRetries"},
		{[]string{"POISON_MEMO=maybe"}, "POISON_MEMO", "PoisonMemo"},
		{[]string{"BROKER=nats", "NATS_ACK_WAIT=soon"}, "NATS_ACK_WAIT", "nats.ack_wait"},
		{[]string{"BROKER=nats", "NATS_ACKWAIT=5s"}, "NATS_ACKWAIT", "nats.ackwait"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
			defer cancel()
			cmd := exec.CommandContext(ctx, loyaltyBin)
			cmd.Env = append([]string{
				"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME"),
				"DATABASE_URL=postgres://postgres@127.0.0.1:1/none?sslmode=disable&connect_timeout=1",
				"METRICS_ADDR=off", "AMQP_DIAL_TIMEOUT=-1s", "KAFKA_DIAL_TIMEOUT=-1s",
			}, tc.env...)
			out, err := cmd.CombinedOutput()
			var exit *exec.ExitError
			require.ErrorAs(t, err, &exit, "loyalty must exit with an error; output:\n%s", out)
			require.False(t, errors.Is(ctx.Err(), context.DeadlineExceeded), "loyalty did not fail fast; output:\n%s", out)
			require.NotZero(t, exit.ExitCode())
			line := string(out)
			require.Contains(t, line, "loyalty: stopped", "output:\n%s", out)
			require.True(t, strings.Contains(line, `field \"`+tc.name+`\"`) || strings.Contains(line, "environment variable "+tc.name+":"),
				"the error names %s; output:\n%s", tc.name, out)
			require.NotContains(t, line, tc.not, "output:\n%s", out)
		})
	}
}
