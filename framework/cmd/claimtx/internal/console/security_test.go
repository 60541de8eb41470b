package console_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/framework/cmd/claimtx/internal/console"
)

const token = "0123456789abcdef-test-token"

// Every response carries the security headers; pages are never cached.
func TestSecurityHeaders(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	for _, path := range []string{"/", "/lookup", "/healthz", "/assets/console.css", "/no-such-page"} {
		r := e.get(path)
		h := r.header
		require.Equal(t, "default-src 'none'; style-src 'self'; img-src 'self' data:; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
			h.Get("Content-Security-Policy"), path)
		require.Equal(t, "nosniff", h.Get("X-Content-Type-Options"), path)
		require.Equal(t, "no-referrer", h.Get("Referrer-Policy"), path)
		require.Equal(t, "DENY", h.Get("X-Frame-Options"), path)
		if !strings.HasPrefix(path, "/assets/") {
			require.Equal(t, "no-store", h.Get("Cache-Control"), path)
		}
	}
	require.Equal(t, "ok", e.ok("/healthz"))
	require.Contains(t, e.ok("/assets/console.css"), "claimtx console")
	require.NotContains(t, e.ok("/"), "<script", "no JavaScript")
}

// Without a token, only loopback host names (and the listen address)
// are answered: a DNS-rebinding page's Host is refused.
func TestHostCheckWithoutToken(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *console.Config) { c.Listen = "127.0.0.2:7070" })
	for host, want := range map[string]int{
		"localhost:7070":   http.StatusOK,
		"LOCALHOST":        http.StatusOK,
		"127.0.0.1:1":      http.StatusOK,
		"[::1]:7070":       http.StatusOK,
		"127.0.0.2:9999":   http.StatusOK, // the listen address
		"evil.example":     http.StatusMisdirectedRequest,
		"evil.example:80":  http.StatusMisdirectedRequest,
		"127.0.0.1.nip.io": http.StatusMisdirectedRequest,
		"10.0.0.5:7070":    http.StatusMisdirectedRequest,
	} {
		req, err := http.NewRequest(http.MethodGet, e.srv.URL+"/", nil)
		require.NoError(t, err)
		req.Host = host
		require.Equal(t, want, e.do(req).status, host)
	}
	// A token makes the console reachable under any name: the session
	// protects it then.
	et := newEnv(t, func(c *console.Config) { c.Token = token })
	req, err := http.NewRequest(http.MethodGet, et.srv.URL+"/healthz", nil)
	require.NoError(t, err)
	req.Host = "console.internal:7070"
	require.Equal(t, http.StatusOK, et.do(req).status)
}

// With a token every page but /healthz, /login and /assets needs a
// session (or the bearer); the login sets a strict, HttpOnly cookie and
// redirects to the page asked for, on this site only.
func TestTokenLogin(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *console.Config) { c.Token = token })
	r := e.get("/lookup?consumer=a&key=b")
	require.Equal(t, http.StatusSeeOther, r.status)
	require.Equal(t, "/login?next="+url.QueryEscape("/lookup?consumer=a&key=b"), r.header.Get("Location"))
	for _, p := range []string{"/", "/dead-letters", "/jobs/x"} {
		require.Equal(t, http.StatusSeeOther, e.get(p).status, p)
	}
	require.Equal(t, http.StatusUnauthorized, e.post("/poison-memo/clear", url.Values{}).status)
	require.Equal(t, http.StatusOK, e.get("/healthz").status)
	require.Equal(t, http.StatusOK, e.get("/assets/console.css").status)

	login := e.ok("/login?next=/dead-letters")
	require.Contains(t, login, `name="token"`)
	require.Contains(t, login, "Sign in")
	csrf := csrfField.FindStringSubmatch(login)
	require.NotNil(t, csrf)

	// A wrong token: 401, no cookie.
	r = e.post("/login", url.Values{"token": {"wrong-wrong-wrong-wrong"}, "csrf": {csrf[1]}, "next": {"/dead-letters"}})
	require.Equal(t, http.StatusUnauthorized, r.status)
	require.Empty(t, r.header.Values("Set-Cookie"))
	require.Contains(t, r.body, "Wrong token")
	// The login form needs its CSRF token too.
	require.Equal(t, http.StatusForbidden, e.post("/login", url.Values{"token": {token}, "next": {"/"}}).status)

	// Open redirects are refused: the target stays on this site.
	for _, next := range []string{"//evil.example/x", "https://evil.example/", "/\\evil.example", "evil"} {
		e.signOut() // the login form's token belongs to the signed-out visitor
		r = e.post("/login", url.Values{"token": {token}, "csrf": {csrf[1]}, "next": {next}})
		require.Equal(t, http.StatusSeeOther, r.status, next)
		require.Equal(t, "/", r.header.Get("Location"), next)
	}
	e.signOut()
	r = e.post("/login", url.Values{"token": {token}, "csrf": {csrf[1]}, "next": {"/dead-letters?page=2"}})
	require.Equal(t, http.StatusSeeOther, r.status)
	require.Equal(t, "/dead-letters?page=2", r.header.Get("Location"))
	ck := r.header.Get("Set-Cookie")
	require.Contains(t, ck, "claimtx_console=")
	require.Contains(t, ck, "HttpOnly")
	require.Contains(t, ck, "SameSite=Strict")
	require.Contains(t, ck, "Path=/")
	require.NotContains(t, ck, "Secure", "plain HTTP: a Secure cookie would never come back")
	require.NotContains(t, ck, token)

	body := e.ok("/")
	require.Contains(t, body, "<h1>Overview</h1>")
	require.Contains(t, body, "Sign out")

	// A forged cookie is no session.
	other := newEnvOn(t, e.pool, e.schema, func(c *console.Config) { c.Token = token })
	req, err := http.NewRequest(http.MethodGet, other.srv.URL+"/", nil)
	require.NoError(t, err)
	for _, c := range e.client.Jar.Cookies(mustURL(t, e.srv.URL)) {
		req.AddCookie(c) // signed by another process's key
	}
	require.Equal(t, http.StatusSeeOther, other.do(req).status)

	// Scripts: the bearer token, no CSRF field needed.
	anon := newEnvOn(t, e.pool, e.schema, func(c *console.Config) { c.Token = token })
	require.Equal(t, http.StatusOK, anon.get("/", "Authorization", "Bearer "+token).status)
	require.Equal(t, http.StatusSeeOther, anon.get("/", "Authorization", "Bearer "+token+"x").status)
	require.Equal(t, http.StatusUnauthorized, anon.post("/poison-memo/clear", url.Values{}, "Authorization", "Bearer nope-nope-nope-nope").status)
}

// Failed logins are rate limited per process.
func TestLoginRateLimit(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *console.Config) { c.Token = token })
	csrf := csrfField.FindStringSubmatch(e.ok("/login"))[1]
	limited := 0
	for range 20 {
		switch e.post("/login", url.Values{"token": {"guess-guess-guess-guess"}, "csrf": {csrf}}).status {
		case http.StatusTooManyRequests:
			limited++
		case http.StatusUnauthorized:
		default:
			t.Fatal("unexpected status")
		}
	}
	require.Positive(t, limited, "20 guesses in a burst: some must be refused")
}

// Wrong bearer tokens spend the same budget as failed logins: a script
// cannot guess the token faster than the login form can.
func TestBearerRateLimit(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *console.Config) { c.Token = token })
	for range 20 {
		require.Equal(t, http.StatusUnauthorized, e.post("/poison-memo/clear", url.Values{}, "Authorization", "Bearer guess-guess-guess-guess").status)
	}
	// The budget is spent: even the right token waits for it to refill.
	require.Equal(t, http.StatusUnauthorized, e.post("/poison-memo/clear", url.Values{}, "Authorization", "Bearer "+token).status)
	csrf := csrfField.FindStringSubmatch(e.ok("/login"))[1]
	require.Equal(t, http.StatusTooManyRequests, e.post("/login", url.Values{"token": {"guess-guess-guess-guess"}, "csrf": {csrf}}).status)
}

// A short token is a configuration error.
func TestShortTokenRefused(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	_, err := console.New(console.Config{Pool: e.pool, Schema: e.schema, Token: "short"})
	require.ErrorContains(t, err, "at least 16")
}

func mustURL(t *testing.T, s string) *url.URL {
	t.Helper()
	u, err := url.Parse(s)
	require.NoError(t, err)
	return u
}

// Over TLS the session cookie is Secure.
func TestSecureCookieOverTLS(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *console.Config) { c.Token = token })
	srv := httptest.NewTLSServer(e.con)
	t.Cleanup(srv.Close)
	client := srv.Client()
	client.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	resp, err := client.Get(srv.URL + "/login")
	require.NoError(t, err)
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	_ = resp.Body.Close()
	csrf := csrfField.FindStringSubmatch(string(b))[1]
	resp, err = client.PostForm(srv.URL+"/login", url.Values{"token": {token}, "csrf": {csrf}})
	require.NoError(t, err)
	_ = resp.Body.Close()
	require.Equal(t, http.StatusSeeOther, resp.StatusCode)
	require.Contains(t, resp.Header.Get("Set-Cookie"), "; Secure")
}

// Behind a proxy that terminates TLS (X-Forwarded-Proto: https) the
// session cookie is Secure too: the browser speaks https. Over plain HTTP
// (loopback, ssh -L) it cannot be, or the browser would never send it.
func TestSecureCookieBehindTLSProxy(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *console.Config) { c.Token = token })
	csrf := csrfField.FindStringSubmatch(e.ok("/login"))[1]
	form := url.Values{"token": {token}, "csrf": {csrf}}
	proxied := e.post("/login", form, "X-Forwarded-Proto", "https")
	require.Equal(t, http.StatusSeeOther, proxied.status)
	require.Contains(t, proxied.header.Get("Set-Cookie"), "; Secure")
	// Signed in now: the form's CSRF token is bound to the new session.
	form.Set("csrf", csrfField.FindStringSubmatch(e.ok("/login"))[1])
	plain := e.post("/login", form)
	require.Equal(t, http.StatusSeeOther, plain.status)
	require.NotContains(t, plain.header.Get("Set-Cookie"), "; Secure")
}
