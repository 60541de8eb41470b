package nats_test

import (
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	natsgo "github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/framework"
)

// TestPublishRefusalsArePermanent: what JetStream or the server will never
// take, however often it is sent, fails with a framework.Permanent error,
// which the Poison middleware acts on (a smaller copy, then the
// dead-letter table) instead of nacking the original forever: headers
// over JetStream's 64 KiB, a message over the server's max_payload or the
// stream's max_msg_size, a metadata key no header can carry, no stream
// with streams: require. A message that fits goes through afterwards.
func TestPublishRefusalsArePermanent(t *testing.T) {
	t.Parallel()
	requireNATS(t)
	topic := uniqueName(t)
	js := rawJS(t, topic)
	cfg := config("durable=svc", "subject_prefix="+topic+".")
	pub := newPublisher(t, cfg)

	headers := message.NewMessage("h", []byte("{}"))
	headers.Metadata.Set("reason", strings.Repeat("r", 70_000))
	payload := message.NewMessage("p", make([]byte, 1<<20))
	badKey := message.NewMessage("k", []byte("{}"))
	badKey.Metadata.Set("has space", "x")
	for name, m := range map[string]*message.Message{"headers over 64 KiB": headers, "over max_payload": payload, "bad key": badKey} {
		err := pub.Publish("orders", m)
		require.Error(t, err, name)
		require.True(t, framework.IsPermanent(err), "%s: %v", name, err)
	}

	// The stream's own limit.
	_, err := js.AddStream(&natsgo.StreamConfig{Name: topic + "-small", Subjects: []string{topic + ".small"}, MaxMsgSize: 1024})
	require.NoError(t, err)
	err = pub.Publish("small", message.NewMessage("s", make([]byte, 2048)))
	require.Error(t, err)
	require.True(t, framework.IsPermanent(err), "over max_msg_size: %v", err)
	require.NoError(t, pub.Publish("small", message.NewMessage("s", make([]byte, 100))))

	err = newPublisher(t, config("durable=svc", "streams=require", "subject_prefix="+topic+".none.")).Publish("orders", message.NewMessage("n", nil))
	require.ErrorContains(t, err, "no JetStream stream captures the subject")
	require.True(t, framework.IsPermanent(err), "no stream: %v", err)

	require.NoError(t, pub.Publish("orders", message.NewMessage("ok", []byte("{}"))), "what fits goes through")
}
