package chaos

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"

	natsgo "github.com/nats-io/nats.go"
)

// natsDurable is the durable consumer the loyalty processes share (their
// consumer name; examples/loyalty defaults NATS_DURABLE to it).
const natsDurable = "loyalty"

// natsOps publishes like a plain nats.go JetStream producer (subject =
// topic, an event_id header) and disrupts the consumers' connections
// only: they reach NATS through a TCP proxy of this runner's, whose
// connections disrupt cuts, so the shared server and anyone else's
// clients are left alone. The consumers' nats.go clients must reconnect
// and resubscribe by themselves; acks lost with the connections come back
// as redeliveries.
type natsOps struct {
	url, topic string
	keep       bool // keep the streams at the end
	proxy      *tcpProxy
	nc         *natsgo.Conn
	js         natsgo.JetStreamContext
}

func (n *natsOps) name() string { return "nats" }

// consumerURL is the NATS URL the consumers get: the proxy's.
func (n *natsOps) consumerURL() string { return "nats://" + n.proxy.addr() }

func (n *natsOps) prepare(context.Context) error {
	nc, err := natsgo.Connect(n.url, natsgo.MaxReconnects(-1), natsgo.Name("claimtx-chaos-runner"))
	if err != nil {
		return fmt.Errorf("connect to NATS at %s: %w", n.url, err)
	}
	n.nc = nc
	if n.js, err = nc.JetStream(); err != nil {
		return err
	}
	// The stream the consumers would create (named after the subject),
	// made first so nothing published before they subscribe is dropped.
	if _, err := n.js.AddStream(&natsgo.StreamConfig{Name: n.topic, Subjects: []string{n.topic}}); err != nil {
		return fmt.Errorf("create stream %s: %w", n.topic, err)
	}
	return nil
}

// publish sends ds, each acknowledged by JetStream. A chunk that fails is
// sent again whole, as a producer retrying would: more duplicates.
func (n *natsOps) publish(ctx context.Context, ds []delivery) (int, error) {
	return publishRetrying(ctx, "NATS", func() (int, error) { return n.publishOnce(ctx, ds) })
}

func (n *natsOps) publishOnce(ctx context.Context, ds []delivery) (int, error) {
	for i, d := range ds {
		m := natsgo.NewMsg(n.topic)
		m.Header.Set("event_id", d.eventID)
		m.Data = d.payload
		if _, err := n.js.PublishMsg(m, natsgo.Context(ctx)); err != nil {
			return i + 1, err // it may have been stored: counted as sent
		}
	}
	return len(ds), nil
}

// unacked is how many of the stream's messages lie past the durable's
// ack floor (acked ones above it count too, so 0 means every one is
// acked), and the consumer's own pending and unacked counts.
func (n *natsOps) unacked() (pastFloor uint64, pending, ackPending int, err error) {
	si, err := n.js.StreamInfo(n.topic)
	if err != nil {
		return 0, 0, 0, err
	}
	ci, err := n.js.ConsumerInfo(n.topic, natsDurable)
	if errors.Is(err, natsgo.ErrConsumerNotFound) {
		return si.State.Msgs, int(si.State.Msgs), 0, nil
	}
	if err != nil {
		return 0, 0, 0, err
	}
	return si.State.LastSeq - ci.AckFloor.Stream, int(ci.NumPending), ci.NumAckPending, nil
}

// drained: the durable acked everything the stream holds.
func (n *natsOps) drained(context.Context) (bool, error) {
	past, pending, ackPending, err := n.unacked()
	return err == nil && past == 0 && pending == 0 && ackPending == 0, err
}

// remaining is read after every consumer stopped: whatever the durable
// has not acked.
func (n *natsOps) remaining(context.Context) (int, error) {
	past, _, _, err := n.unacked()
	return int(past), err
}

func (n *natsOps) poisonStream() string { return n.topic + "_poison" }

func (n *natsOps) poisonedCount(context.Context) (int, error) {
	si, err := n.js.StreamInfo(n.poisonStream())
	if errors.Is(err, natsgo.ErrStreamNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	return int(si.State.Msgs), nil
}

// poisoned reads every message of the poison stream (without removing
// it) and returns each one's event_id and poison reason.
func (n *natsOps) poisoned(context.Context) ([]poisonedMsg, error) {
	si, err := n.js.StreamInfo(n.poisonStream())
	if errors.Is(err, natsgo.ErrStreamNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []poisonedMsg
	for seq := si.State.FirstSeq; si.State.Msgs > 0 && seq <= si.State.LastSeq; seq++ {
		m, err := n.js.GetMsg(n.poisonStream(), seq)
		if errors.Is(err, natsgo.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			return out, err
		}
		out = append(out, poisonedMsg{eventID: m.Header.Get("event_id"), reason: m.Header.Get(poisonReasonKey)})
	}
	return out, nil
}

// disrupt cuts every consumer connection (the proxy's); the consumers
// reconnect through the proxy at once.
func (n *natsOps) disrupt(context.Context) (string, error) {
	cut := n.proxy.cut()
	if cut == 0 {
		return "", errors.New("found none of the consumers' NATS connections to cut")
	}
	return fmt.Sprintf("cut the consumers' %d NATS connections (TCP proxy)", cut), nil
}

func (n *natsOps) close() {
	if n.nc != nil {
		if !n.keep {
			// Streams without limits keep everything: remove the run's.
			_ = n.js.DeleteStream(n.topic)
			_ = n.js.DeleteStream(n.poisonStream())
		}
		n.nc.Close()
	}
	n.proxy.close()
}

// tcpProxy forwards connections from a loopback port to target and can
// cut all of them at once.
type tcpProxy struct {
	ln     net.Listener
	target string

	mu    sync.Mutex
	conns map[net.Conn]net.Conn // client -> server
	wg    sync.WaitGroup
}

func startProxy(target string) (*tcpProxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &tcpProxy{ln: ln, target: target, conns: map[net.Conn]net.Conn{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

func (p *tcpProxy) addr() string { return p.ln.Addr().String() }

func (p *tcpProxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = c.Close()
			continue
		}
		p.mu.Lock()
		p.conns[c] = s
		p.mu.Unlock()
		p.wg.Add(2)
		pipe := func(dst, src net.Conn) {
			defer p.wg.Done()
			_, _ = io.Copy(dst, src)
			_ = dst.Close()
			_ = src.Close()
			p.mu.Lock()
			delete(p.conns, c)
			p.mu.Unlock()
		}
		go pipe(s, c)
		go pipe(c, s)
	}
}

// cut closes every proxied connection and returns how many there were.
func (p *tcpProxy) cut() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := len(p.conns)
	for c, s := range p.conns {
		_ = c.Close()
		_ = s.Close()
		delete(p.conns, c)
	}
	return n
}

func (p *tcpProxy) close() {
	if p == nil {
		return
	}
	_ = p.ln.Close()
	p.cut()
	p.wg.Wait()
}
