package observe_test

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/brokers"
	"github.com/claimtx/claimtx/brokers/amqp"
	"github.com/claimtx/claimtx/brokers/kafka"
	"github.com/claimtx/claimtx/brokers/kafka/kafkatest"
	"github.com/claimtx/claimtx/framework/observe"
	"github.com/claimtx/claimtx/store"
)

// healthz answers one /healthz request from h, as a probe would.
func healthz(h http.Handler) (int, string) {
	rr := httptest.NewRecorder()
	h.ServeHTTP(rr, httptest.NewRequest(http.MethodGet, "/healthz", nil))
	return rr.Code, rr.Body.String()
}

// awaitHealthz waits until /healthz answers want.
func awaitHealthz(t *testing.T, h http.Handler, want int, why string) {
	t.Helper()
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		code, body := healthz(h)
		assert.Equal(c, want, code, body)
	}, 30*time.Second, 50*time.Millisecond, why)
}

// TestHealthReconnectAMQP: readiness follows the project's RabbitMQ
// subscriber's connection. The subscriber connects through a TCP proxy owned
// by this test, so the test cuts its own connection (and keeps it cut while it
// asserts not-ready) without touching the shared RabbitMQ or anyone else's
// connection.
//
// Skipped under -race for the reason TestReconnect in brokers/amqp is: the
// dependency's reconnect writes its connection state without synchronisation
// (see brokers/amqp/doc.go); set CLAIMTX_RECONNECT_UNDER_RACE=1 to see it.
// make test-disruptive runs it without -race.
func TestHealthReconnectAMQP(t *testing.T) {
	if raceEnabled && os.Getenv("CLAIMTX_RECONNECT_UNDER_RACE") == "" {
		t.Skip("watermill-amqp's reconnect path is racy; run without -race (make test-disruptive)")
	}
	t.Parallel()
	st := newStore(t, 2)

	target := "127.0.0.1:5672"
	amqpURL := "amqp://guest:guest@127.0.0.1:5672/" // the adapter's default
	if u := os.Getenv("TEST_AMQP_URL"); u != "" {
		amqpURL = u
		pu, err := url.Parse(u)
		require.NoError(t, err)
		target = pu.Host
	}
	p := startProxy(t, target)
	pu, err := url.Parse(amqpURL)
	require.NoError(t, err)
	pu.Host = p.addr

	sub, err := amqp.NewSubscriber(t.Context(), brokers.AMQPConfig{
		URL:                      pu.String(),
		DialTimeout:              10 * time.Second,
		ReconnectInitialInterval: 50 * time.Millisecond,
		ReconnectMaxInterval:     200 * time.Millisecond,
		ConnectionName:           "claimtx-observe-health-test",
	}, nil)
	require.NoError(t, err)
	h := subscriberHealth(t, st, sub, "AMQP")
	code, body := healthz(h)
	require.Equal(t, http.StatusOK, code, body)

	p.stop()
	awaitHealthz(t, h, http.StatusServiceUnavailable, "RabbitMQ unreachable: not ready")
	_, body = healthz(h)
	require.Contains(t, body, `"broker"`)

	p.start(t)
	awaitHealthz(t, h, http.StatusOK, "RabbitMQ back: ready again after the reconnect")
}

// subscriberHealth is the readiness of st and of sub, closed when the test
// ends, which must report its connection as the project's subscribers do.
func subscriberHealth(t *testing.T, st *store.Store, sub message.Subscriber, broker string) observe.Health {
	t.Helper()
	t.Cleanup(func() { _ = sub.Close() })
	check := observe.SubscriberConnected(sub)
	require.NotNil(t, check, "the project's %s subscriber must report its connection", broker)
	return observe.Health{Store: st, Broker: check, Timeout: time.Second}
}

// TestHealthKafkaBrokerDown: readiness follows the reachability of the
// project's Kafka subscriber's brokers. The test stops its own dev broker,
// then starts it again on the same address.
func TestHealthKafkaBrokerDown(t *testing.T) {
	t.Parallel()
	st := newStore(t, 2)

	b, err := kafkatest.Start(t.Context(), kafkatest.Options{Addr: "127.0.0.1:0", Partitions: 1})
	require.NoError(t, err)
	addr := b.Addrs()[0]
	t.Cleanup(func() { _ = b.Close() })

	sub, err := kafka.NewSubscriber(t.Context(), brokers.KafkaConfig{
		Brokers:       []string{addr},
		ConsumerGroup: "claimtx-observe-health-test",
		DialTimeout:   5 * time.Second,
	}, nil)
	require.NoError(t, err)
	h := subscriberHealth(t, st, sub, "Kafka")
	awaitHealthz(t, h, http.StatusOK, "Kafka up: ready")

	require.NoError(t, b.Close())
	awaitHealthz(t, h, http.StatusServiceUnavailable, "Kafka stopped: not ready")

	b2, err := kafkatest.Start(t.Context(), kafkatest.Options{Addr: addr, Partitions: 1})
	require.NoError(t, err)
	t.Cleanup(func() { _ = b2.Close() })
	awaitHealthz(t, h, http.StatusOK, "Kafka back on the same address: ready again")
}

// proxy forwards TCP connections from addr to target; stop closes the
// listener and every connection through it, start listens on addr again.
type proxy struct {
	addr, target string

	mu    sync.Mutex
	ln    net.Listener
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

func startProxy(t *testing.T, target string) *proxy {
	t.Helper()
	p := &proxy{addr: "127.0.0.1:0", target: target, conns: map[net.Conn]struct{}{}}
	p.start(t)
	t.Cleanup(func() { p.stop(); p.wg.Wait() })
	return p
}

func (p *proxy) start(t *testing.T) {
	t.Helper()
	ln, err := net.Listen("tcp", p.addr)
	require.NoError(t, err)
	p.mu.Lock()
	p.ln = ln
	p.addr = ln.Addr().String()
	p.mu.Unlock()
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			p.wg.Add(1)
			go func() {
				defer p.wg.Done()
				p.pipe(c)
			}()
		}
	}()
}

func (p *proxy) pipe(c net.Conn) {
	up, err := net.DialTimeout("tcp", p.target, 5*time.Second)
	if err != nil {
		_ = c.Close()
		return
	}
	p.mu.Lock()
	if p.ln == nil { // stopped meanwhile
		p.mu.Unlock()
		_ = c.Close()
		_ = up.Close()
		return
	}
	p.conns[c], p.conns[up] = struct{}{}, struct{}{}
	p.mu.Unlock()
	done := make(chan struct{}, 2)
	cp := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src) // ends when either side closes
		done <- struct{}{}
	}
	go cp(up, c)
	go cp(c, up)
	<-done
	_ = c.Close()
	_ = up.Close()
	<-done
	p.mu.Lock()
	delete(p.conns, c)
	delete(p.conns, up)
	p.mu.Unlock()
}

func (p *proxy) stop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln != nil {
		_ = p.ln.Close()
		p.ln = nil
	}
	for c := range p.conns {
		_ = c.Close()
	}
}
