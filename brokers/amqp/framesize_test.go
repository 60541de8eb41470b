package amqp_test

import (
	"context"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/brokers/amqp"
	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/internal/testenv"
)

// frameTooLarge is RabbitMQ's reason when it closes a connection over a
// frame: {frame_too_large,<the frame's payload>,<frame_max - 8>}.
var frameTooLarge = regexp.MustCompile(`frame_too_large,(\d+),(\d+)`)

// TestHeaderFrameSizeIsRabbitMQs checks the size the Publisher computes
// against what RabbitMQ measures: a publishing (every property set, headers
// of every type) whose content header frame is computed at exactly
// frame_max - 8 bytes, the limit the Publisher keeps to, is taken; one
// over frame_max closes the connection with FRAME_ERROR quoting that same
// size.
func TestHeaderFrameSizeIsRabbitMQs(t *testing.T) {
	t.Parallel()
	queue := newQueue(t)
	ch := rawChannel(t)
	_, err := ch.QueueDeclare(queue, true, false, false, false, nil)
	require.NoError(t, err)
	publishing := func(pad int) amqp091.Publishing {
		return amqp091.Publishing{
			ContentType: "application/json", ContentEncoding: "identity", DeliveryMode: amqp091.Persistent, Priority: 1,
			CorrelationId: "corr", ReplyTo: "reply", Expiration: "60000", MessageId: "id", Timestamp: time.Unix(1700000000, 0),
			Type: "order", AppId: "test",
			Headers: amqp091.Table{
				"s": "string", "b": true, "i8": int8(-1), "i16": int16(2), "i32": int32(3), "i64": int64(4),
				"f32": float32(1.5), "f64": 2.5, "d": amqp091.Decimal{Scale: 2, Value: 12345}, "t": time.Unix(1, 0),
				"x": []byte{0, 1, 2}, "v": nil, "a": []any{"e", int32(1), amqp091.Table{"k": "v"}},
				"nested": amqp091.Table{"x-death": []any{amqp091.Table{"count": int64(1), "queue": "q"}}},
				"pad":    strings.Repeat("p", pad),
			},
			Body: []byte("{}"),
		}
	}
	conn, err := amqp091.Dial(amqpURL())
	require.NoError(t, err)
	frameMax := conn.Config.FrameSize
	require.NoError(t, conn.Close())
	require.Positive(t, frameMax, "RabbitMQ negotiates a frame size")
	limit := frameMax - 8
	pad := limit - amqp.HeaderFrameSize(publishing(0))
	require.Equal(t, limit, amqp.HeaderFrameSize(publishing(pad)))

	publish := func(p amqp091.Publishing) error {
		conn, err := amqp091.Dial(amqpURL())
		require.NoError(t, err)
		defer func() { _ = conn.Close() }()
		ch, err := conn.Channel()
		require.NoError(t, err)
		require.NoError(t, ch.Confirm(false))
		closed := conn.NotifyClose(make(chan *amqp091.Error, 1))
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		conf, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", queue, false, false, p)
		if err != nil {
			// RabbitMQ may close the connection over the frame before
			// the client has written the whole publishing: the reason
			// is in the close.
			select {
			case e := <-closed:
				if e != nil {
					return e
				}
			case <-ctx.Done():
			}
			return err
		}
		select {
		case e := <-closed:
			return e
		case <-conf.Done():
			if !conf.Acked() {
				return <-closed
			}
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	require.NoError(t, publish(publishing(pad)), "a header frame of frame_max - 8 bytes is taken")
	// RabbitMQ 3.10 takes up to frame_max itself, though it names
	// frame_max - 8 as the limit; the Publisher keeps to the stricter one.
	err = publish(publishing(pad + 9))
	require.Error(t, err, "one byte over frame_max is not")
	m := frameTooLarge.FindStringSubmatch(err.Error())
	require.NotNil(t, m, "RabbitMQ's reason: %v", err)
	require.Equal(t, strconv.Itoa(frameMax+1), m[1], "RabbitMQ measures the frame as computed")
	require.Equal(t, strconv.Itoa(limit), m[2])
}

// TestPublishRefusesHeadersOverTheFrameSize: the Publisher refuses a
// message whose headers do not fit in a frame, with a permanent error,
// instead of sending it and having RabbitMQ close the connection; the
// next message goes through on the same connection.
func TestPublishRefusesHeadersOverTheFrameSize(t *testing.T) {
	t.Parallel()
	queue := newQueue(t)
	pub, err := amqp.NewPublisher(context.Background(), testConfig(), nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = pub.Close() })

	big := message.NewMessage("big", []byte("{}"))
	big.Metadata.Set("reason", strings.Repeat("r", 300_000))
	err = pub.Publish(queue, big)
	require.Error(t, err)
	require.True(t, framework.IsPermanent(err), "a message that can never fit is refused for good: %v", err)
	require.Contains(t, err.Error(), "frame_max 131072")

	ok := message.NewMessage("ok", []byte("{}"))
	ok.Metadata.Set("reason", strings.Repeat("r", 1000))
	require.NoError(t, pub.Publish(queue, ok), "the connection is still up")
	q, err := rawChannel(t).QueueDeclarePassive(queue, true, false, false, false, nil)
	require.NoError(t, err)
	require.Equal(t, 1, q.Messages, "only the message that fits was sent")
}

// TestPublishAccessRefusedIsPermanent: a topic whose queue the user may not
// declare (RabbitMQ's configure permission) can never be published to, so
// the error says so (framework.Permanent): a poison copy to such a queue
// goes to its fallback instead of being redelivered forever. The
// publisher's other topics are unaffected.
func TestPublishAccessRefusedIsPermanent(t *testing.T) {
	t.Parallel()
	ctl := testenv.RequireTool(t, "rabbitmqctl")
	suffix := strings.TrimPrefix(uniqueName(t), "claimtx-test-")
	user, pass := "claimtx-perm-"+suffix, "pw-"+suffix
	run := func(args ...string) {
		out, err := exec.Command(ctl, args...).CombinedOutput()
		require.NoError(t, err, "rabbitmqctl %v: %s", args, out)
	}
	run("add_user", user, pass)
	t.Cleanup(func() { _ = exec.Command(ctl, "delete_user", user).Run() })
	allowed, denied := "allowed-"+suffix, "denied-"+suffix
	run("set_permissions", "-p", "/", user, "^allowed-.*", ".*", ".*")
	deleteQueuesAtCleanup(t, allowed)

	cfg := testConfig()
	cfg.URL = "amqp://" + user + ":" + pass + "@127.0.0.1:5672/"
	pub, err := amqp.NewPublisher(context.Background(), cfg, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = pub.Close() })

	err = pub.Publish(denied, message.NewMessage("1", []byte("x")))
	require.Error(t, err)
	require.True(t, framework.IsPermanent(err), "got %v", err)
	require.Contains(t, err.Error(), "ACCESS_REFUSED")
	require.NoError(t, pub.Publish(allowed, message.NewMessage("2", []byte("y"))))
}

// TestPublishWriteRefusedIsPermanent: a user who may declare the queue
// but not publish (RabbitMQ's write permission on the default exchange)
// can never send a message, so the refusal says so (framework.Permanent)
// and a poison copy goes to its fallback instead of being redelivered
// forever.
func TestPublishWriteRefusedIsPermanent(t *testing.T) {
	t.Parallel()
	ctl := testenv.RequireTool(t, "rabbitmqctl")
	suffix := strings.TrimPrefix(uniqueName(t), "claimtx-test-")
	user, pass := "claimtx-write-"+suffix, "pw-"+suffix
	run := func(args ...string) {
		out, err := exec.Command(ctl, args...).CombinedOutput()
		require.NoError(t, err, "rabbitmqctl %v: %s", args, out)
	}
	run("add_user", user, pass)
	t.Cleanup(func() { _ = exec.Command(ctl, "delete_user", user).Run() })
	queue := "nowrite-" + suffix
	run("set_permissions", "-p", "/", user, ".*", "^$", ".*")
	deleteQueuesAtCleanup(t, queue)

	cfg := testConfig()
	cfg.URL = "amqp://" + user + ":" + pass + "@127.0.0.1:5672/"
	pub, err := amqp.NewPublisher(context.Background(), cfg, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = pub.Close() })

	err = pub.Publish(queue, message.NewMessage("1", []byte("x")))
	require.Error(t, err)
	require.True(t, framework.IsPermanent(err), "got %v", err)
	require.Contains(t, err.Error(), "ACCESS_REFUSED")
}
