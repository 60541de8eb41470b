package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/claimtx/claimtx/internal/testenv"
)

// requireNoSecrets fails if any of the texts shows any of the secrets.
func requireNoSecrets(t *testing.T, what string, text string, secrets ...string) {
	t.Helper()
	for _, s := range secrets {
		require.NotContains(t, text, s, "%s shows a password", what)
	}
}

// scrape returns the body of an HTTP GET.
func scrape(t *testing.T, u string) string {
	t.Helper()
	body, err := get(u)
	require.NoError(t, err)
	return body
}

// get returns the body of an HTTP GET; it does not fail the test, for
// conditions polled until they hold.
func get(u string) (string, error) {
	resp, err := http.Get(u)
	if err != nil {
		return "", err
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

// requireEndpointsClean scrapes /metrics and /healthz of a running consumer
// and checks neither shows a secret.
func requireEndpointsClean(t *testing.T, p *proc, secrets ...string) {
	t.Helper()
	metrics := p.metricsURL(t)
	body := scrape(t, metrics)
	require.Contains(t, body, "claimtx_messages_total")
	requireNoSecrets(t, "/metrics", body, secrets...)
	// Ready, broker included: the broker check must work through the same
	// TLS and credentials as the consumer (the Kafka probe opens its own
	// connection with them). Asked until it says so: the probe has a
	// second for dial, TLS and SCRAM against a broker that runs under
	// -race in the test process, and a slow one is retried after the 2s
	// its answer is cached. Every answer is checked for secrets.
	healthURL := strings.TrimSuffix(metrics, "/metrics") + "/healthz"
	var health string
	ready := waitUntil(30*time.Second, func() bool {
		var err error
		if health, err = get(healthURL); err != nil {
			return false
		}
		requireNoSecrets(t, "/healthz", health, secrets...)
		return strings.Contains(health, `"broker":"ok"`) && strings.Contains(health, `"ready":true`)
	})
	require.True(t, ready, "/healthz never reported ready with the broker ok: %s", health)
}

// TestNoCredentialsInErrors: start-up failures of every kind (unreachable
// or refusing servers, unparsable URLs) end the consumer with an error
// that names the problem and never the password. TestNoCredentialsInLogs
// covers the logs of a consumer that runs; TestKafkaTLSAndSASL the SASL
// password.
func TestNoCredentialsInErrors(t *testing.T) {
	t.Parallel()
	h := newHarness(t, "amqp")
	pgPass, amqpPass := "PgPw-"+randID(), "AmqpPw-"+randID()
	withPG := func(u string) string {
		return strings.Replace(u, "postgres://postgres@", "postgres://postgres:"+pgPass+"@", 1)
	}
	for _, tc := range []struct {
		name string
		env  []string
		want string // the error names the problem
	}{
		{"postgres unreachable", []string{"DATABASE_URL=" + withPG(strings.Replace(h.dbURL, "127.0.0.1:5432", "127.0.0.1:1", 1)), "STARTUP_TIMEOUT=1s"},
			"connect"},
		{"postgres URL unparsable", []string{"DATABASE_URL=postgres://postgres:" + pgPass + "@[::1"},
			"DATABASE_URL"},
		{"postgres unknown role", []string{"DATABASE_URL=" + withPG(strings.Replace(h.dbURL, "postgres://postgres@", "postgres://nosuchrole_"+randID()+"@", 1))},
			"nosuchrole"},
		{"rabbitmq refuses the password", []string{"DATABASE_URL=" + withPG(h.dbURL), "AMQP_URL=amqp://nosuchuser:" + amqpPass + "@127.0.0.1:5672/"},
			"403"},
		{"rabbitmq unreachable", []string{"DATABASE_URL=" + withPG(h.dbURL), "AMQP_URL=amqp://guest:" + amqpPass + "@127.0.0.1:1/", "AMQP_DIAL_TIMEOUT=1s"},
			"cannot connect to amqp://guest:xxxxx@127.0.0.1:1/"},
		{"rabbitmq URL unparsable", []string{"AMQP_URL=amqp://guest:" + amqpPass + "@127.0.0.1:port/"},
			"AMQP_URL"}, // the variable the user set
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := h.start(tc.env...)
			require.True(t, p.exited(60*time.Second), "the consumer must stop on %s", tc.name)
			require.Error(t, p.err)
			out := p.out.String()
			require.Contains(t, out, "loyalty: stopped")
			require.Contains(t, out, tc.want)
			requireNoSecrets(t, "the error", out, pgPass, amqpPass)
		})
	}
}

// TestNoCredentialsInMetrics: a consumer with passwords in DATABASE_URL and
// AMQP_URL serves /metrics and /healthz (after consuming and poisoning)
// without them.
func TestNoCredentialsInMetrics(t *testing.T) {
	t.Parallel()
	h, amqpPass, pgPass := secretHarness(t, "claimtx_metrics_")

	p := h.start()
	good := orders(1, 10)
	h.publish(good...)
	h.publishRaw([]string{"bad"}, [][]byte{[]byte("not json")})
	h.waitApplied(len(good))
	h.poisoned(1)
	requireEndpointsClean(t, p, amqpPass, pgPass)
	p.stop()
	requireNoSecrets(t, "the logs", p.out.String(), amqpPass, pgPass)
}

// secretHarness is an amqp harness whose RabbitMQ user (a fresh one,
// prefix and an id) and Postgres URL carry passwords; trust authentication
// ignores the Postgres one, so any will do.
func secretHarness(t *testing.T, prefix string) (h *harness, amqpPass, pgPass string) {
	t.Helper()
	testenv.RequireTool(t, "rabbitmqctl")
	h = newHarness(t, "amqp")
	user := prefix + randID()
	amqpPass, pgPass = "AmqpPw-"+randID(), "PgPw-"+randID()
	rabbitUser(t, user, amqpPass)
	h.amqpURL = fmt.Sprintf("amqp://%s:%s@127.0.0.1:5672/", user, amqpPass)
	h.dbURL = strings.Replace(h.dbURL, "postgres://postgres@", "postgres://postgres:"+pgPass+"@", 1)
	require.Contains(t, h.dbURL, pgPass)
	return h, amqpPass, pgPass
}

func rabbitUser(t *testing.T, user, pass string) {
	t.Helper()
	run := func(args ...string) {
		out, err := exec.Command("rabbitmqctl", args...).CombinedOutput()
		require.NoError(t, err, string(out))
	}
	run("add_user", user, pass)
	t.Cleanup(func() { _ = exec.Command("rabbitmqctl", "delete_user", user).Run() })
	run("set_permissions", "-p", "/", user, ".*", ".*", ".*")
}

// testCA writes a CA certificate (PEM) to a file and returns its path and a
// server TLS config for 127.0.0.1 and localhost signed by it.
func testCA(t *testing.T) (caFile string, server *tls.Config) {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "claimtx test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	require.NoError(t, err)
	ca, err := x509.ParseCertificate(caDER)
	require.NoError(t, err)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, DNSNames: []string{"localhost"},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	require.NoError(t, err)
	caFile = filepath.Join(t.TempDir(), "ca.pem")
	require.NoError(t, os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), 0o600))
	return caFile, &tls.Config{
		MinVersion:   tls.VersionTLS12,
		Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}},
	}
}

// TestKafkaTLSAndSASL: the consumer reaches a Kafka broker that only speaks
// TLS and requires SCRAM-SHA-512, configured by KAFKA_TLS,
// KAFKA_TLS_CA_FILE and KAFKA_SASL_*, and credits every order once; the
// SASL password shows nowhere (logs, /metrics, /healthz), and a wrong one
// stops the consumer with an error that does not show it either.
func TestKafkaTLSAndSASL(t *testing.T) {
	t.Parallel()
	caFile, serverTLS := testCA(t)
	user, pass := "loyalty", "KafkaPw-"+randID()
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.TLS(serverTLS), kfake.EnableSASL(),
		kfake.Superuser("SCRAM-SHA-512", user, pass), kfake.GroupMinSessionTimeout(100*time.Millisecond))
	require.NoError(t, err)
	t.Cleanup(cluster.Close)

	h := newHarness(t, "kafka")
	h.kafkaAddr = cluster.ListenAddrs()[0]
	pool := x509.NewCertPool()
	caPEM, err := os.ReadFile(caFile)
	require.NoError(t, err)
	require.True(t, pool.AppendCertsFromPEM(caPEM))
	cl, err := kgo.NewClient(kgo.SeedBrokers(h.kafkaAddr), kgo.ProducerLinger(0),
		kgo.DialTLSConfig(&tls.Config{MinVersion: tls.VersionTLS12, RootCAs: pool, ServerName: "127.0.0.1"}),
		kgo.SASL(scram.Auth{User: user, Pass: pass}.AsSha512Mechanism()))
	require.NoError(t, err)
	t.Cleanup(cl.Close)
	h.kcl = cl
	_, err = kadm.NewClient(cl).CreateTopic(context.Background(), 3, 1, nil, h.topic)
	require.NoError(t, err)

	tlsEnv := []string{"KAFKA_TLS=true", "KAFKA_TLS_CA_FILE=" + caFile, "KAFKA_SASL_MECHANISM=SCRAM-SHA-512", "KAFKA_SASL_USER=" + user}
	p := h.start(append(tlsEnv, "KAFKA_SASL_PASSWORD="+pass)...)
	ords := orders(1, 30)
	h.publish(ords...)
	h.publish(ords[:10]...)
	h.waitApplied(len(ords))
	h.assertExact(ords)
	requireEndpointsClean(t, p, pass)
	p.stop()
	requireNoSecrets(t, "the logs", p.out.String(), pass)

	wrong := "WrongPw-" + randID()
	bad := h.start(append(tlsEnv, "KAFKA_SASL_PASSWORD="+wrong, "KAFKA_DIAL_TIMEOUT=2s")...)
	require.True(t, bad.exited(60*time.Second), "a wrong SASL password stops the consumer")
	require.Contains(t, bad.out.String(), "loyalty: stopped")
	requireNoSecrets(t, "the error", bad.out.String(), pass, wrong)
}

// TestPostgresSSLMode: DATABASE_URL's sslmode reaches the driver; with
// sslmode=require every connection of the consumer is encrypted.
func TestPostgresSSLMode(t *testing.T) {
	t.Parallel()
	h := newHarness(t, "amqp")
	var ssl string
	require.NoError(t, h.pool.QueryRow(context.Background(), "SHOW ssl").Scan(&ssl))
	if ssl != "on" {
		testenv.SkipOrFail(t, "the Postgres server has ssl = off")
	}
	app := "loyalty_tls_" + randID()
	u, err := url.Parse(h.dbURL)
	require.NoError(t, err)
	q := u.Query()
	q.Set("sslmode", "require")
	q.Set("application_name", app)
	u.RawQuery = q.Encode()
	h.dbURL = u.String()

	h.start()
	ords := orders(1, 10)
	h.publish(ords...)
	h.waitApplied(len(ords))
	var conns int
	var allSSL bool
	require.NoError(t, h.pool.QueryRow(context.Background(), `SELECT count(*), coalesce(bool_and(s.ssl), false)
		FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid) WHERE a.application_name = $1`, app).Scan(&conns, &allSSL))
	require.Positive(t, conns)
	require.True(t, allSSL, "every connection of the consumer uses TLS")
}

// TestAMQPS: an amqps:// AMQP_URL with the CA in its cacertfile parameter
// reaches RabbitMQ over TLS (through a TLS-terminating proxy, as a load
// balancer in front of RabbitMQ would be), and a certificate the CA did not
// sign is refused.
func TestAMQPS(t *testing.T) {
	t.Parallel()
	h := newHarness(t, "amqp")
	caFile, serverTLS := testCA(t)
	addr, handshakes := tlsProxy(t, serverTLS, "127.0.0.1:5672")

	h.start(fmt.Sprintf("AMQP_URL=amqps://guest:guest@%s/?cacertfile=%s", addr, url.QueryEscape(caFile)))
	ords := orders(1, 10)
	h.publish(ords...)
	h.waitApplied(len(ords))
	h.assertExact(ords)
	require.Positive(t, handshakes.Load(), "the consumer connected through TLS")

	// Another CA: the handshake fails and the consumer gives up.
	otherCA, _ := testCA(t)
	p := h.start(fmt.Sprintf("AMQP_URL=amqps://guest:guest@%s/?cacertfile=%s", addr, url.QueryEscape(otherCA)), "AMQP_DIAL_TIMEOUT=1s")
	require.True(t, p.exited(60*time.Second))
	require.Contains(t, p.out.String(), "certificate")
}

// tlsProxy terminates TLS on a free port and forwards to target. It counts
// the completed handshakes.
func tlsProxy(t *testing.T, cfg *tls.Config, target string) (string, *atomic.Int64) {
	t.Helper()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
	require.NoError(t, err)
	var handshakes atomic.Int64
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	track := func(c net.Conn) {
		mu.Lock()
		defer mu.Unlock()
		conns = append(conns, c)
	}
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		for _, c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			track(c)
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer func() { _ = c.Close() }()
				if err := c.(*tls.Conn).Handshake(); err != nil {
					return
				}
				handshakes.Add(1)
				up, err := net.Dial("tcp", target)
				if err != nil {
					return
				}
				track(up)
				defer func() { _ = up.Close() }()
				done := make(chan struct{}, 2)
				go func() { _, _ = io.Copy(up, c); done <- struct{}{} }()
				go func() { _, _ = io.Copy(c, up); done <- struct{}{} }()
				<-done
			}()
		}
	}()
	return ln.Addr().String(), &handshakes
}

// TestNATSNoCredentialsInLogs: a consumer on NATS with a password in
// NATS_URL (the local server has no authentication and ignores it) logs
// at debug level, consumes, poisons, reports ready on /healthz (the
// broker check included) and stops: no log line, metric or health answer
// shows the password. An unparsable NATS_URL fails naming the variable,
// without quoting it.
func TestNATSNoCredentialsInLogs(t *testing.T) {
	t.Parallel()
	h := newHarness(t, "nats")
	secret := "NatsPw-" + randID()
	p := h.start("NATS_URL=nats://app:"+secret+"@127.0.0.1:4222", "LOG_LEVEL=debug")
	good := orders(1, 10)
	h.publish(good...)
	h.publishRaw([]string{"bad"}, [][]byte{[]byte("not json")})
	h.waitApplied(len(good))
	h.poisoned(1)
	requireEndpointsClean(t, p, secret)
	p.stop()
	require.NoError(t, p.err)
	logs := p.out.String()
	require.Contains(t, logs, "loyalty: consuming")
	requireNoSecrets(t, "the logs", logs, secret)

	bad := h.start("NATS_URL=nats://app:"+secret+"@127.0.0.1:4222:x/", "METRICS_ADDR=off")
	require.True(t, bad.exited(30*time.Second), "a bad NATS_URL must stop the consumer")
	require.Contains(t, bad.out.String(), `field \"NATS_URL\"`)
	requireNoSecrets(t, "the error", bad.out.String(), secret)
}
