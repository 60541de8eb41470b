package console_test

import (
	"context"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/claimtx/claimtx/framework/cmd/claimtx/internal/console"
	"github.com/claimtx/claimtx/internal/testenv"
	"github.com/claimtx/claimtx/store"
)

func TestMain(m *testing.M) {
	testenv.VerifyTestMain(m,
		// The test client's idle keep-alive connections.
		goleak.IgnoreAnyFunction("net/http.(*persistConn).readLoop"),
		goleak.IgnoreAnyFunction("net/http.(*persistConn).writeLoop"),
	)
}

// env is one console over its own migrated schema.
type env struct {
	t      *testing.T
	pool   *pgxpool.Pool
	schema string
	con    *console.Console
	srv    *httptest.Server
	client *http.Client // keeps cookies, does not follow redirects
}

// newEnv starts a console; edit adjusts its Config (Pool and Schema are
// set already).
func newEnv(t *testing.T, edit func(*console.Config)) *env {
	t.Helper()
	pool, schema := testenv.Setup(t, 8)
	st, err := store.New(pool, store.Config{Schema: schema})
	require.NoError(t, err)
	require.NoError(t, st.Migrate(context.Background()))
	return newEnvOn(t, pool, schema, edit)
}

func newEnvOn(t *testing.T, pool *pgxpool.Pool, schema string, edit func(*console.Config)) *env {
	t.Helper()
	cfg := console.Config{Pool: pool, Schema: schema}
	if edit != nil {
		edit(&cfg)
	}
	con, err := console.New(cfg)
	require.NoError(t, err)
	srv := httptest.NewServer(con)
	t.Cleanup(func() {
		srv.Close()
		con.Close()
	})
	jar, err := cookiejar.New(nil)
	require.NoError(t, err)
	client := &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	t.Cleanup(client.CloseIdleConnections)
	return &env{t: t, pool: pool, schema: schema, con: con, srv: srv, client: client}
}

// response is a response read whole.
type response struct {
	status int
	header http.Header
	body   string
}

func (e *env) do(req *http.Request) response {
	e.t.Helper()
	resp, err := e.client.Do(req)
	require.NoError(e.t, err)
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	require.NoError(e.t, err)
	return response{status: resp.StatusCode, header: resp.Header, body: string(b)}
}

func (e *env) get(path string, headers ...string) response {
	e.t.Helper()
	req, err := http.NewRequest(http.MethodGet, e.srv.URL+path, nil)
	require.NoError(e.t, err)
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	return e.do(req)
}

// post sends a form; headers are name, value pairs.
func (e *env) post(path string, form url.Values, headers ...string) response {
	e.t.Helper()
	req, err := http.NewRequest(http.MethodPost, e.srv.URL+path, strings.NewReader(form.Encode()))
	require.NoError(e.t, err)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	return e.do(req)
}

// ok GETs path and requires a 200.
func (e *env) ok(path string) string {
	e.t.Helper()
	r := e.get(path)
	require.Equal(e.t, http.StatusOK, r.status, "GET %s: %s", path, r.body)
	return r.body
}

var csrfField = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

// exec runs SQL in the env's schema.
func (e *env) exec(sql string, args ...any) {
	e.t.Helper()
	_, err := e.pool.Exec(context.Background(), sql, args...)
	require.NoError(e.t, err)
}

// signOut forgets the client's cookies.
func (e *env) signOut() {
	jar, err := cookiejar.New(nil)
	require.NoError(e.t, err)
	e.client.Jar = jar
}
