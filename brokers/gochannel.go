package brokers

import (
	"context"
	"errors"
	"sync"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/claimtx/claimtx/internal/config"
)

// goChannels are the GoChannels of the "gochannel" kind, one per distinct
// GoChannelConfig, each closed (dropping persisted messages) when the last
// publisher or subscriber built on it closes.
var goChannels = struct {
	sync.Mutex
	m map[GoChannelConfig]*sharedGoChannel
}{m: make(map[GoChannelConfig]*sharedGoChannel)}

type sharedGoChannel struct {
	key  GoChannelConfig
	gc   *gochannel.GoChannel
	refs int
}

func (s *sharedGoChannel) release() error {
	goChannels.Lock()
	s.refs--
	last := s.refs == 0
	if last {
		delete(goChannels.m, s.key)
	}
	goChannels.Unlock()
	if last {
		return s.gc.Close()
	}
	return nil
}

// goChannelClient is a publisher or subscriber on a shared GoChannel.
// Closing it ends its own subscriptions only.
type goChannelClient struct {
	shared *sharedGoChannel
	ctx    context.Context // cancelled by Close
	cancel context.CancelFunc
	once   sync.Once
}

func newGoChannelClient(cfg GoChannelConfig, logger watermill.LoggerAdapter) goChannelClient {
	key := config.Defaults(cfg)
	goChannels.Lock()
	defer goChannels.Unlock()
	s := goChannels.m[key]
	if s == nil {
		s = &sharedGoChannel{key: key, gc: gochannel.NewGoChannel(gochannel.Config{
			OutputChannelBuffer:            key.Buffer,
			Persistent:                     key.Persistent,
			BlockPublishUntilSubscriberAck: key.BlockPublishUntilSubscriberAck,
		}, logger)}
		goChannels.m[key] = s
	}
	s.refs++
	ctx, cancel := context.WithCancel(context.Background())
	return goChannelClient{shared: s, ctx: ctx, cancel: cancel}
}

func (c *goChannelClient) Close() error {
	var err error
	c.once.Do(func() {
		c.cancel()
		err = c.shared.release()
	})
	return err
}

type goChannelPublisher struct{ goChannelClient }

type goChannelSubscriber struct{ goChannelClient }

func newGoChannelPublisher(cfg Config, logger watermill.LoggerAdapter) (message.Publisher, error) {
	return &goChannelPublisher{newGoChannelClient(cfg.GoChannel, logger)}, nil
}

func newGoChannelSubscriber(cfg Config, logger watermill.LoggerAdapter) (message.Subscriber, error) {
	return &goChannelSubscriber{newGoChannelClient(cfg.GoChannel, logger)}, nil
}

func (p *goChannelPublisher) Publish(topic string, msgs ...*message.Message) error {
	if p.ctx.Err() != nil {
		return errors.New("brokers: gochannel publisher closed")
	}
	return p.shared.gc.Publish(topic, msgs...)
}

// Subscribe subscribes on the shared GoChannel. Like Watermill's GoChannel,
// a nacked message is re-sent at once: fine for tests.
func (s *goChannelSubscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	if s.ctx.Err() != nil {
		return nil, errors.New("brokers: gochannel subscriber closed")
	}
	subCtx, cancel := context.WithCancel(ctx)
	context.AfterFunc(s.ctx, cancel)
	return s.shared.gc.Subscribe(subCtx, topic)
}
