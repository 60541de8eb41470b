package main

import (
	"encoding/binary"
	"io"
	"net"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/claimtx/claimtx/internal/testenv"
)

// pgMode is what a pgProxy does with a new connection.
type pgMode int32

const (
	pgForward  pgMode = iota // forward to the real server
	pgSilent                 // accept and never answer
	pgShutdown               // answer FATAL 57P03, as a server shutting down in a failover
	pgBadPass                // answer FATAL 28P01, as a server refusing the password
)

// pgProxy is the test's own PostgreSQL address: it forwards to the shared
// server or plays a server that is not there yet, shutting down, or
// refusing the password. The shared server is never touched.
type pgProxy struct {
	t    *testing.T
	ln   net.Listener
	mode atomic.Int32
	mu   sync.Mutex
	open []net.Conn
}

func newPGProxy(t *testing.T, mode pgMode) *pgProxy {
	t.Helper()
	return listenPGProxy(t, "127.0.0.1:0", mode)
}

// listenPGProxy is newPGProxy on a given address (one a consumer is
// already dialling, for a database that comes up late).
func listenPGProxy(t *testing.T, addr string, mode pgMode) *pgProxy {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	require.NoError(t, err)
	p := &pgProxy{t: t, ln: ln}
	p.mode.Store(int32(mode))
	t.Cleanup(func() {
		_ = ln.Close()
		p.mu.Lock()
		defer p.mu.Unlock()
		for _, c := range p.open {
			_ = c.Close()
		}
	})
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			p.track(c)
			go p.serve(c)
		}
	}()
	return p
}

func (p *pgProxy) track(c net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.open = append(p.open, c)
}

func (p *pgProxy) setMode(m pgMode) { p.mode.Store(int32(m)) }

// url is dbURL with the proxy as its host.
func (p *pgProxy) url(dbURL string) string {
	u, err := url.Parse(dbURL)
	require.NoError(p.t, err)
	u.Host = p.ln.Addr().String()
	return u.String()
}

func (p *pgProxy) serve(c net.Conn) {
	switch pgMode(p.mode.Load()) {
	case pgSilent:
		return // held open until the test ends
	case pgShutdown:
		p.fatal(c, "57P03", "the database system is shutting down")
	case pgBadPass:
		p.fatal(c, "28P01", `password authentication failed for user "postgres"`)
	default:
		up, err := net.Dial("tcp", "127.0.0.1:5432")
		if err != nil {
			_ = c.Close()
			return
		}
		p.track(up)
		go func() { _, _ = io.Copy(up, c); _ = up.Close() }()
		_, _ = io.Copy(c, up)
		_ = c.Close()
	}
}

// fatal reads the client's startup message (declining SSL or GSS
// encryption first) and answers an ErrorResponse with code, as a server
// refusing the connection does.
func (p *pgProxy) fatal(c net.Conn, code, msg string) {
	defer func() { _ = c.Close() }()
	for {
		var hdr [8]byte
		if _, err := io.ReadFull(c, hdr[:]); err != nil {
			return
		}
		n := int(binary.BigEndian.Uint32(hdr[:4]))
		if n < 8 {
			return
		}
		if _, err := io.CopyN(io.Discard, c, int64(n-8)); err != nil {
			return
		}
		if v := binary.BigEndian.Uint32(hdr[4:]); v == 80877103 || v == 80877104 { // SSLRequest, GSSENCRequest
			if _, err := c.Write([]byte{'N'}); err != nil {
				return
			}
			continue
		}
		break
	}
	var body []byte
	for _, f := range []struct {
		k byte
		v string
	}{{'S', "FATAL"}, {'V', "FATAL"}, {'C', code}, {'M', msg}} {
		body = append(append(append(body, f.k), f.v...), 0)
	}
	body = append(body, 0)
	out := append([]byte{'E'}, binary.BigEndian.AppendUint32(nil, uint32(len(body)+4))...)
	_, _ = c.Write(append(out, body...))
}

// TestStartupWaitsForDatabaseFailover: the database answers 57P03 (a
// failover in progress) when the consumer starts; the consumer must wait,
// saying so at WARN, and consume once the database is back.
func TestStartupWaitsForDatabaseFailover(t *testing.T) {
	t.Parallel()
	h := newHarness(t, "amqp")
	proxy := newPGProxy(t, pgShutdown)
	p := h.start("DATABASE_URL="+proxy.url(h.dbURL), "STARTUP_TIMEOUT=60s")
	p.waitLog(t, "57P03")
	require.Contains(t, p.out.String(), "level=WARN")
	require.Contains(t, p.out.String(), "dependency=PostgreSQL")
	require.True(t, p.running(), "the consumer exited instead of waiting:\n%s", p.out.String())
	proxy.setMode(pgForward) // the database is back
	h.publish(order{OrderID: 1, CustomerID: 7, TotalCents: 1000})
	h.waitApplied(1)
	require.True(t, p.running())
}

// TestStartupWaitsForDatabaseNotUpYet: nothing listens at the database's
// address when the consumer starts; it waits and consumes once it is up.
func TestStartupWaitsForDatabaseNotUpYet(t *testing.T) {
	t.Parallel()
	h := newHarness(t, "amqp")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close()) // refused until the proxy comes up
	u, err := url.Parse(h.dbURL)
	require.NoError(t, err)
	u.Host = addr
	p := h.start("DATABASE_URL="+u.String(), "STARTUP_TIMEOUT=60s")
	p.waitLog(t, "waiting for dependency")
	listenPGProxy(t, addr, pgForward)
	h.publish(order{OrderID: 2, CustomerID: 8, TotalCents: 500})
	h.waitApplied(1)
}

// TestStartupGivesUpOnDatabase: a database that never answers (silent or
// refusing) fails start-up within STARTUP_TIMEOUT, naming PostgreSQL and
// the cause, and a refused login fails at once, named as authentication.
func TestStartupGivesUpOnDatabase(t *testing.T) {
	t.Parallel()
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	closedAddr := closed.Addr().String()
	require.NoError(t, closed.Close())
	base := testenv.URL()
	at := func(host string) string {
		u, err := url.Parse(base)
		require.NoError(t, err)
		u.Host = host
		return u.String()
	}
	badUser, err := url.Parse(base)
	require.NoError(t, err)
	badUser.User = url.User("claimtx_no_such_role")
	for _, tc := range []struct {
		name    string
		url     func(t *testing.T) string
		timeout string
		within  time.Duration
		want    []string
	}{
		{"silent", func(t *testing.T) string { return newPGProxy(t, pgSilent).url(base) }, "2s", 15 * time.Second,
			[]string{"PostgreSQL", "gave up", "deadline exceeded"}},
		{"refused", func(*testing.T) string { return at(closedAddr) }, "2s", 15 * time.Second,
			[]string{"PostgreSQL", "gave up", "connection refused"}},
		{"wrong password", func(t *testing.T) string { return newPGProxy(t, pgBadPass).url(base) }, "60s", 15 * time.Second,
			[]string{"PostgreSQL refused the credentials (authentication failed", "28P01", "1 attempt(s)"}},
		{"unknown user", func(*testing.T) string { return badUser.String() }, "60s", 15 * time.Second,
			[]string{"PostgreSQL refused the credentials (authentication failed", "28000", "1 attempt(s)"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := &harness{t: t, kind: "amqp", amqpURL: amqpURL, topic: "loyalty-startup-" + randID()}
			start := time.Now()
			p := h.start("DATABASE_URL="+tc.url(t), "STARTUP_TIMEOUT="+tc.timeout, "METRICS_ADDR=off")
			require.True(t, p.exited(tc.within), "still running after %s:\n%s", tc.within, p.out.String())
			t.Logf("exited after %s", time.Since(start).Round(time.Millisecond))
			require.Error(t, p.err)
			out := p.out.String()
			require.Contains(t, out, "loyalty: stopped")
			require.NotContains(t, out, "loyalty: create tables")
			for _, w := range tc.want {
				require.Contains(t, out, w)
			}
			if strings.Contains(tc.name, "wrong") || strings.Contains(tc.name, "unknown") {
				require.NotContains(t, out, "waiting for dependency", "an authentication failure was retried")
			}
		})
	}
}

// TestStartupRabbitMQWrongPassword: a refused RabbitMQ login fails at once,
// named as authentication, without the password.
func TestStartupRabbitMQWrongPassword(t *testing.T) {
	t.Parallel()
	h := newHarness(t, "amqp")
	bad := strings.Replace(amqpURL, "guest:guest@", "guest:wrong-pw-42@", 1)
	require.NotEqual(t, amqpURL, bad)
	out := requireRefusedAtOnce(t, h, 15*time.Second, "RabbitMQ", "wrong-pw-42",
		"AMQP_URL="+bad, "STARTUP_TIMEOUT=60s", "METRICS_ADDR=off")
	require.Contains(t, out, "403")
}

// requireRefusedAtOnce starts the consumer with env, requires it to exit
// non-zero within bound (far below STARTUP_TIMEOUT: no retries) naming
// dependency's refusal as authentication, never as "not reachable", and
// without the secret; it returns the output.
func requireRefusedAtOnce(t *testing.T, h *harness, bound time.Duration, dependency, secret string, env ...string) string {
	t.Helper()
	start := time.Now()
	p := h.start(env...)
	require.True(t, p.exited(bound), "still running:\n%s", p.out.String())
	t.Logf("exited after %s", time.Since(start).Round(time.Millisecond))
	require.Error(t, p.err)
	out := p.out.String()
	require.Contains(t, out, dependency+" refused the credentials (authentication failed")
	require.NotContains(t, out, "not reachable yet")
	require.NotContains(t, out, secret)
	return out
}

// TestStartupKafkaWrongSASLPassword: a Kafka broker (the test's own kfake)
// refusing the SASL password fails start-up at once, named as
// authentication, not retried as "not reachable".
func TestStartupKafkaWrongSASLPassword(t *testing.T) {
	t.Parallel()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.EnableSASL(),
		kfake.Superuser("SCRAM-SHA-256", "loyalty", "right-secret"), kfake.AllowAutoTopicCreation())
	require.NoError(t, err)
	t.Cleanup(c.Close)
	pool, schema := testenv.Setup(t, 2)
	pool.Close()
	dbURL, err := testenv.URLWithSearchPath(schema)
	require.NoError(t, err)
	h := &harness{t: t, kind: "kafka", dbURL: dbURL, schema: schema, topic: "loyalty-startup-" + randID(),
		kafkaAddr: c.ListenAddrs()[0], group: "loyalty-startup-" + randID()}
	requireRefusedAtOnce(t, h, 20*time.Second, "Kafka", "wrong-secret-42",
		"STARTUP_TIMEOUT=60s", "METRICS_ADDR=off", "KAFKA_SASL_MECHANISM=SCRAM-SHA-256",
		"KAFKA_SASL_USER=loyalty", "KAFKA_SASL_PASSWORD=wrong-secret-42")
}
