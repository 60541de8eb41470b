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

// The process-wide GoChannels of the "gochannel" kind, one per distinct
// GoChannelConfig, reference counted: an instance lives while at least one
// publisher or subscriber built on it is open, and is closed (dropping
// persisted messages) when the last one closes.
var goChannels = struct {
	sync.Mutex
	m map[GoChannelConfig]*sharedGoChannel
}{m: make(map[GoChannelConfig]*sharedGoChannel)}

type sharedGoChannel struct {
	key  GoChannelConfig
	gc   *gochannel.GoChannel
	refs int
}

func acquireGoChannel(cfg GoChannelConfig, logger watermill.LoggerAdapter) *sharedGoChannel {
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
	return s
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

type goChannelPublisher struct {
	shared *sharedGoChannel
	once   sync.Once
	closed chan struct{}
}

func newGoChannelPublisher(cfg Config, logger watermill.LoggerAdapter) (message.Publisher, error) {
	return &goChannelPublisher{shared: acquireGoChannel(cfg.GoChannel, logger), closed: make(chan struct{})}, nil
}

func (p *goChannelPublisher) Publish(topic string, msgs ...*message.Message) error {
	select {
	case <-p.closed:
		return errors.New("brokers: gochannel publisher closed")
	default:
	}
	return p.shared.gc.Publish(topic, msgs...)
}

func (p *goChannelPublisher) Close() error {
	var err error
	p.once.Do(func() {
		close(p.closed)
		err = p.shared.release()
	})
	return err
}

type goChannelSubscriber struct {
	shared *sharedGoChannel
	ctx    context.Context // cancelled by Close: ends every subscription
	cancel context.CancelFunc
	once   sync.Once
}

func newGoChannelSubscriber(cfg Config, logger watermill.LoggerAdapter) (message.Subscriber, error) {
	ctx, cancel := context.WithCancel(context.Background())
	return &goChannelSubscriber{shared: acquireGoChannel(cfg.GoChannel, logger), ctx: ctx, cancel: cancel}, nil
}

// Subscribe subscribes on the shared GoChannel. Closing this subscriber
// ends its subscriptions only, not the GoChannel other publishers and
// subscribers share. Like Watermill's GoChannel, a nacked message is
// re-sent at once: fine for tests, which is what this kind is for.
func (s *goChannelSubscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	if s.ctx.Err() != nil {
		return nil, errors.New("brokers: gochannel subscriber closed")
	}
	subCtx, cancel := context.WithCancel(ctx)
	context.AfterFunc(s.ctx, cancel)
	return s.shared.gc.Subscribe(subCtx, topic)
}

func (s *goChannelSubscriber) Close() error {
	var err error
	s.once.Do(func() {
		s.cancel()
		err = s.shared.release()
	})
	return err
}
