package nats_test

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	natsgo "github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/internal/testenv"
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

// TestPublishDeniedIsPermanent: a subject the user may not publish to (a
// poison subject left out of its permissions) can never be published to.
// The server says so asynchronously and the JetStream publish only times
// out waiting for its acknowledgement; the publisher recognises the
// refusal and reports it as framework.Permanent, so the Poison middleware
// dead-letters the message instead of nacking it forever. The test runs a
// NATS server of its own, with users and permissions.
func TestPublishDeniedIsPermanent(t *testing.T) {
	t.Parallel()
	server := testenv.RequireTool(t, "nats-server")
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	dir := t.TempDir()
	conf := filepath.Join(dir, "nats.conf")
	require.NoError(t, os.WriteFile(conf, []byte(fmt.Sprintf(`
listen: %q
jetstream { store_dir: %q }
accounts {
  app {
    jetstream: enabled
    users: [ { user: svc, password: secret, permissions: { publish: { deny: ["denied.>"] } } } ]
  }
}
`, addr, filepath.Join(dir, "js"))), 0o600))
	cmd := exec.Command(server, "-c", conf)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	require.Eventually(t, func() bool {
		c, err := net.DialTimeout("tcp", addr, 100*time.Millisecond)
		if err == nil {
			_ = c.Close()
		}
		return err == nil
	}, 15*time.Second, 20*time.Millisecond, "nats-server listens")

	cfg := config("durable=svc", "user=svc", "password=secret")
	cfg.NATS.URL = "nats://" + addr
	pub := newPublisher(t, cfg)
	err = pub.Publish("denied.poison", message.NewMessage("d", []byte("{}")))
	require.Error(t, err)
	require.True(t, framework.IsPermanent(err), "got %v", err)
	require.ErrorContains(t, err, "permissions violation")
	require.NoError(t, pub.Publish("allowed", message.NewMessage("a", []byte("{}"))), "other subjects go through")
}
