//go:build disruptive

package amqp_test

import (
	"bytes"
	"context"
	"os/exec"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/brokers/amqp"
	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/internal/testenv"
)

// TestMaxMessageSizeDisruptive: a body over RabbitMQ's max_message_size
// is refused for good (PRECONDITION_FAILED), so a poison copy that large
// goes to its fallback instead of being redelivered forever; a body under
// it still goes through. max_message_size is broker-wide on RabbitMQ
// 3.x, so the test lowers it for its own few seconds and puts it back:
// that is why it is disruptive, and make test-disruptive runs it alone.
func TestMaxMessageSizeDisruptive(t *testing.T) {
	ctl := testenv.RequireTool(t, "rabbitmqctl")
	eval := func(expr string) string {
		out, err := exec.Command(ctl, "eval", expr).CombinedOutput()
		require.NoError(t, err, "rabbitmqctl eval %s: %s", expr, out)
		return strings.TrimSpace(string(out))
	}
	old := eval("application:get_env(rabbit, max_message_size).")
	require.True(t, strings.HasPrefix(old, "{ok,"), "max_message_size: %s", old)
	limit := 64 << 10
	eval("application:set_env(rabbit, max_message_size, 65536).")
	t.Cleanup(func() {
		eval("application:set_env(rabbit, max_message_size, " + strings.TrimSuffix(strings.TrimPrefix(old, "{ok,"), "}") + ").")
	})

	queue := uniqueName(t)
	deleteQueuesAtCleanup(t, queue)
	pub, err := amqp.NewPublisher(context.Background(), testConfig(), nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = pub.Close() })

	err = pub.Publish(queue, message.NewMessage("big", bytes.Repeat([]byte("x"), limit+1)))
	require.Error(t, err)
	require.True(t, framework.IsPermanent(err), "got %v", err)
	require.Contains(t, err.Error(), "PRECONDITION_FAILED")

	// The limit refuses that message, not the publisher: a small one
	// after it is sent (the publisher replaces a channel RabbitMQ closed).
	require.NoError(t, pub.Publish(queue, message.NewMessage("small", []byte("x"))))
}
