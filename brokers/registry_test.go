package brokers_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/brokers"
	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/internal/testenv"
)

func uniqueKind(t *testing.T) string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return "test-" + hex.EncodeToString(b)
}

// TestRegisterCustomKind: a user adapter is selected by name, reads its own
// options and validates them.
func TestRegisterCustomKind(t *testing.T) {
	t.Parallel()
	kind := uniqueKind(t)
	c, err := brokers.DefaultConfig().OverlayEnv(mapEnv(map[string]string{"BROKER": kind}))
	require.NoError(t, err)

	// Until it is registered, the kind is unknown, named by the variable
	// it came from.
	_, err = brokers.NewPublisher(c, nil)
	require.ErrorIs(t, err, brokers.ErrInvalidKind)
	var ce *framework.ConfigError
	require.ErrorAs(t, err, &ce)
	require.Equal(t, "BROKER", ce.Field, "named by the variable it came from")

	var gotRegion string
	shared := gochannel.NewGoChannel(gochannel.Config{Persistent: true}, nil)
	t.Cleanup(func() { _ = shared.Close() })
	brokers.Register(kind, brokers.Factory{
		NewSubscriber: func(c brokers.Config, _ watermill.LoggerAdapter) (message.Subscriber, error) {
			gotRegion = c.Options["region"]
			return shared, nil
		},
		NewPublisher: func(brokers.Config, watermill.LoggerAdapter) (message.Publisher, error) {
			return shared, nil
		},
		Validate: func(c brokers.Config) error {
			if c.Options["region"] == "" {
				return errors.New("region is required")
			}
			return nil
		},
	})

	// Validate and the constructors run the kind's own Validate.
	for _, err := range []error{c.Validate(), func() error { _, err := brokers.NewPublisher(c, nil); return err }()} {
		require.ErrorAs(t, err, &ce)
		require.Equal(t, "options", ce.Field)
		require.ErrorContains(t, err, "region is required")
	}

	c.Options = map[string]string{"region": "eu"}
	require.NoError(t, c.Validate())
	pub, err := brokers.NewPublisher(c, nil)
	require.NoError(t, err)
	sub, err := brokers.NewSubscriber(c, nil)
	require.NoError(t, err)
	require.Equal(t, "eu", gotRegion)

	require.NoError(t, pub.Publish("t", message.NewMessage("1", []byte("x"))))
	msgs, err := sub.Subscribe(t.Context(), "t")
	require.NoError(t, err)
	m := testenv.Receive(t, msgs, 5*time.Second)
	require.Equal(t, "1", m.UUID)
	m.Ack()
}

// TestRegisterPanics: Register panics on a malformed name, an incomplete
// Factory and a name that is taken, like database/sql.Register.
func TestRegisterPanics(t *testing.T) {
	t.Parallel()
	ok := brokers.Factory{
		NewSubscriber: func(brokers.Config, watermill.LoggerAdapter) (message.Subscriber, error) { return nil, nil },
		NewPublisher:  func(brokers.Config, watermill.LoggerAdapter) (message.Publisher, error) { return nil, nil },
	}
	panicValue := func(kind string, f brokers.Factory) (v any) {
		defer func() { v = recover() }()
		brokers.Register(kind, f)
		return nil
	}
	for _, name := range []string{"", "Upper", "has space", "-lead", string(make([]byte, 64))} {
		err, isErr := panicValue(name, ok).(error)
		require.True(t, isErr, "%q", name)
		require.ErrorIs(t, err, brokers.ErrInvalidKind, "%q", name)
		var ce *framework.ConfigError
		require.ErrorAs(t, err, &ce, "%q", name)
		require.Equal(t, "kind", ce.Field)
	}
	err, isErr := panicValue(uniqueKind(t), brokers.Factory{}).(error)
	require.True(t, isErr)
	require.ErrorIs(t, err, brokers.ErrInvalidKind)
	for _, builtin := range []string{"amqp", "kafka", "gochannel"} {
		require.Equal(t, "brokers: Register called twice for kind "+builtin, panicValue(builtin, ok))
	}
	kind := uniqueKind(t)
	require.Nil(t, panicValue(kind, ok))
	require.NotNil(t, panicValue(kind, ok))
}

// TestRegisterConcurrent: registering and building at once is safe (run
// with -race).
func TestRegisterConcurrent(t *testing.T) {
	t.Parallel()
	ok := brokers.Factory{
		NewSubscriber: func(brokers.Config, watermill.LoggerAdapter) (message.Subscriber, error) { return nil, nil },
		NewPublisher:  func(brokers.Config, watermill.LoggerAdapter) (message.Publisher, error) { return nil, nil },
	}
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			kind := uniqueKind(t)
			brokers.Register(kind, ok)
			if _, err := brokers.NewPublisher(brokers.Config{Kind: kind}, nil); err != nil {
				t.Error(err)
			}
			_, _ = brokers.NewSubscriber(brokers.Config{Kind: "unknown"}, nil) // reads while others write
		})
	}
	wg.Wait()
}

// TestFactoryErrorWrapped: an adapter's construction error keeps its cause.
func TestFactoryErrorWrapped(t *testing.T) {
	t.Parallel()
	cause := errors.New("boom")
	kind := uniqueKind(t)
	brokers.Register(kind, brokers.Factory{
		NewSubscriber: func(brokers.Config, watermill.LoggerAdapter) (message.Subscriber, error) { return nil, cause },
		NewPublisher:  func(brokers.Config, watermill.LoggerAdapter) (message.Publisher, error) { return nil, cause },
	})
	_, err := brokers.NewSubscriber(brokers.Config{Kind: kind}, nil)
	require.ErrorIs(t, err, cause)
	require.ErrorContains(t, err, kind)
	_, err = brokers.NewPublisher(brokers.Config{Kind: kind}, nil)
	require.ErrorIs(t, err, cause)
}

// TestGoChannelShared: a publisher and a subscriber built from the same
// Config talk to each other; another name is another broker.
func TestGoChannelShared(t *testing.T) {
	t.Parallel()
	cfg := brokers.Config{Kind: brokers.KindGoChannel, GoChannel: brokers.GoChannelConfig{Name: uniqueKind(t)}}
	sub, err := brokers.NewSubscriber(cfg, nil)
	require.NoError(t, err)
	other := cfg
	other.GoChannel.Name += "-other"
	otherSub, err := brokers.NewSubscriber(other, nil)
	require.NoError(t, err)
	defer otherSub.Close()

	msgs, err := sub.Subscribe(t.Context(), "orders")
	require.NoError(t, err)
	otherMsgs, err := otherSub.Subscribe(t.Context(), "orders")
	require.NoError(t, err)

	pub, err := brokers.NewPublisher(cfg, nil)
	require.NoError(t, err)
	m := message.NewMessage("m1", []byte("x"))
	m.Metadata.Set("event_id", "e1")
	require.NoError(t, pub.Publish("orders", m))

	got := testenv.Receive(t, msgs, 5*time.Second)
	require.Equal(t, "e1", got.Metadata.Get("event_id"))
	got.Ack()
	select {
	case got := <-otherMsgs:
		t.Fatalf("other GoChannel got %s", got.UUID)
	case <-time.After(50 * time.Millisecond):
	}

	// Closing the publisher does not stop the subscriber's GoChannel.
	require.NoError(t, pub.Close())
	require.Error(t, pub.Publish("orders", m))
	pub2, err := brokers.NewPublisher(cfg, nil)
	require.NoError(t, err)
	require.NoError(t, pub2.Publish("orders", message.NewMessage("m2", nil)))
	got = testenv.Receive(t, msgs, 5*time.Second)
	require.Equal(t, "m2", got.UUID, "after the first publisher closed")
	got.Ack()

	// Closing the subscriber ends its subscriptions.
	require.NoError(t, sub.Close())
	require.Eventually(t, func() bool {
		_, open := <-msgs
		return !open
	}, 5*time.Second, time.Millisecond)
	_, err = sub.Subscribe(context.Background(), "orders")
	require.Error(t, err)
	require.NoError(t, pub2.Close())
}
