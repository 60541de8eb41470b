package nats_test

import (
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/tests"
	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/brokers"
	"github.com/claimtx/claimtx/internal/testenv"
)

// TestPubSubConformance runs Watermill's Pub/Sub suite against the adapter
// as a user builds it (the nats kind, options in
// brokers.Config), on the local NATS:
//
//   - concurrency1: one queue subscription and max_ack_pending 1, so the
//     ordering tests apply (with more in flight a nacked message comes
//     back behind the ones already delivered). Consumer groups are durable
//     names: the suite's groups each get a durable of their own and see
//     every message. The full suite, except under -short.
//   - concurrency4: the default concurrency, without the ordering
//     features, in the suite's short form.
//
// Every subscriber of one run shares one durable (a topic is consumed by
// one service), so a new subscriber does not see messages another one
// acked: NewSubscriberReceivesOldMessages is false. TestReconnect needs a
// server restart command and is skipped: restarting the shared NATS
// would break the tests beside it.
func TestPubSubConformance(t *testing.T) {
	t.Parallel()
	requireNATS(t)
	t.Run("concurrency1", func(t *testing.T) {
		t.Parallel()
		runSuite(t, []string{"concurrency=1", "max_ack_pending=1"}, tests.Features{
			ConsumerGroups:                      true,
			GuaranteedOrder:                     true,
			GuaranteedOrderWithSingleSubscriber: true,
			Persistent:                          true,
			ForceShort:                          testing.Short(),
		})
	})
	t.Run("concurrency4", func(t *testing.T) {
		t.Parallel()
		runSuite(t, []string{"concurrency=4"}, tests.Features{ConsumerGroups: true, Persistent: true, ForceShort: true})
	})
}

func runSuite(t *testing.T, opts []string, features tests.Features) {
	prefix := uniqueName(t)
	rawJS(t, prefix) // deletes the suite's streams at the end
	durable := prefix + "-durable"

	closeAtEnd := testenv.CloseAtEnd(t)
	features.GenerateTopicFunc = func(tctx tests.TestContext) string {
		return prefix + "-" + string(tctx.TestID)
	}
	build := func(t *testing.T, cfg brokers.Config) (message.Publisher, message.Subscriber) {
		pub, err := brokers.NewPublisher(cfg, nil)
		require.NoError(t, err)
		sub, err := brokers.NewSubscriber(cfg, nil)
		require.NoError(t, err)
		closeAtEnd(pub, sub)
		return pub, sub
	}
	tests.TestPubSub(t, features,
		func(t *testing.T) (message.Publisher, message.Subscriber) {
			return build(t, config(append(opts, "durable="+durable)...))
		},
		func(t *testing.T, group string) (message.Publisher, message.Subscriber) {
			return build(t, config(append(opts, "durable="+unsafeChars.ReplaceAllString(prefix+"-"+group, "_"))...))
		},
	)
}
