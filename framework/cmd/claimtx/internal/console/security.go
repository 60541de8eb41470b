package console

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// The security model is docs/console.md's "Security model"; secure applies
// it in this order: response headers, the Host check of a console without
// token (a page rebinding its host name to 127.0.0.1 would read it as
// same-origin), CrossOriginProtection, the session or bearer, the body
// bound, read-only mode, and the csrf field (the second belt for browsers
// that send neither Sec-Fetch-Site nor Origin; a bearer needs none, as
// browsers never attach that header on their own).

const (
	cookieName      = "claimtx_console"
	sessionTTL      = 12 * time.Hour // a stolen cookie is not good forever
	maxFormOverhead = 256 << 10      // what a form may send besides a pasted message
	csp             = "default-src 'none'; style-src 'self'; img-src 'self' data:; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)

// stateChanging are the POSTs read-only mode refuses.
var stateChanging = map[string]bool{"/dead-letters/replay": true, "/poison-memo/clear": true, "/parked/retry": true, "/parked/skip": true}

func public(path string) bool {
	return path == "/healthz" || path == "/login" || strings.HasPrefix(path, "/assets/")
}

type ctxKey struct{}

// anonymous is the session of a visitor not signed in, which the login
// form's CSRF token is bound to.
const anonymous = "anonymous"

// identity is a request's session id ("" without a token), or a bearer.
type identity struct {
	session string
	bearer  bool
}

func (c *Console) secure(next http.Handler) http.Handler {
	cop := http.NewCrossOriginProtection()
	cop.SetDenyHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c.fail(w, r, http.StatusForbidden, "cross-origin request refused")
	}))
	inner := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, ok := c.authenticate(r)
		if !ok && !public(r.URL.Path) {
			if r.Method == http.MethodGet || r.Method == http.MethodHead {
				http.Redirect(w, r, "/login?next="+url.QueryEscape(r.URL.RequestURI()), http.StatusSeeOther)
				return
			}
			w.Header().Set("WWW-Authenticate", `Bearer realm="claimtx console"`)
			c.fail(w, r, http.StatusUnauthorized, "sign in first")
			return
		}
		r = r.WithContext(context.WithValue(r.Context(), ctxKey{}, id))
		if r.Method == http.MethodPost {
			// Bounded before the csrf field is read.
			r.Body = http.MaxBytesReader(w, r.Body, maxPaste+maxFormOverhead)
			if err := r.ParseForm(); err != nil {
				var mbe *http.MaxBytesError
				if errors.As(err, &mbe) {
					c.fail(w, r, http.StatusRequestEntityTooLarge, fmt.Sprintf("the form is larger than %d KiB: paste at most 1 MiB", (maxPaste+maxFormOverhead)>>10))
					return
				}
				c.fail(w, r, http.StatusBadRequest, "unreadable form: "+err.Error())
				return
			}
			if c.cfg.ReadOnly && stateChanging[r.URL.Path] {
				c.fail(w, r, http.StatusForbidden, "the console runs read-only: nothing can be changed from it")
				return
			}
			if !id.bearer && !c.csrfOK(r) {
				c.fail(w, r, http.StatusForbidden, "missing or wrong CSRF token: reload the page and try again")
				return
			}
		}
		next.ServeHTTP(w, r)
	})
	protected := cop.Handler(inner)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", csp)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("X-Frame-Options", "DENY")
		if strings.HasPrefix(r.URL.Path, "/assets/") {
			h.Set("Cache-Control", "public, max-age=3600")
		} else {
			h.Set("Cache-Control", "no-store")
		}
		if c.cfg.Token == "" && r.URL.Path != "/healthz" && !c.hostAllowed(r.Host) {
			http.Error(w, "421 misdirected request: this console answers to localhost only (set a token to serve other host names)", http.StatusMisdirectedRequest)
			return
		}
		protected.ServeHTTP(w, r)
	})
}

// hostAllowed is the DNS-rebinding guard of a console without token.
func (c *Console) hostAllowed(hostport string) bool {
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	switch strings.ToLower(host) {
	case "localhost", "127.0.0.1", "::1":
		return true
	case "":
		return false
	}
	if lh, _, err := net.SplitHostPort(c.cfg.Listen); err == nil && lh != "" {
		return strings.EqualFold(host, lh)
	}
	return false
}

// authenticate returns the request's identity; ok is false when a token is
// needed and neither a valid session nor the bearer came.
func (c *Console) authenticate(r *http.Request) (identity, bool) {
	if c.cfg.Token == "" {
		return identity{}, true
	}
	if a := r.Header.Get("Authorization"); strings.HasPrefix(a, "Bearer ") {
		// A wrong bearer spends the login budget, as a wrong form does.
		if c.limiter.Tokens() < 1 {
			return identity{bearer: true}, false
		}
		ok := c.tokenOK(strings.TrimPrefix(a, "Bearer "))
		if !ok {
			c.limiter.Allow() // spends one attempt
		}
		return identity{bearer: true}, ok
	}
	if ck, err := r.Cookie(cookieName); err == nil {
		if s, ok := c.verifySession(ck.Value, time.Now()); ok {
			return identity{session: s}, true
		}
	}
	return identity{session: anonymous}, false
}

// tokenOK compares in constant time; hashing first hides the length too.
func (c *Console) tokenOK(got string) bool {
	a := sha256.Sum256([]byte(got))
	b := sha256.Sum256([]byte(c.cfg.Token))
	return subtle.ConstantTimeCompare(a[:], b[:]) == 1
}

func (c *Console) mac(parts ...string) []byte {
	m := hmac.New(sha256.New, c.key)
	for _, p := range parts {
		m.Write([]byte(p))
		m.Write([]byte{0})
	}
	return m.Sum(nil)
}

var b64 = base64.RawURLEncoding

// newSession returns a cookie value: id.expiry.mac.
func (c *Console) newSession(now time.Time) string {
	raw := make([]byte, 18)
	_, _ = rand.Read(raw)
	id := b64.EncodeToString(raw)
	exp := strconv.FormatInt(now.Add(sessionTTL).Unix(), 10)
	return id + "." + exp + "." + b64.EncodeToString(c.mac("session", id, exp))
}

func (c *Console) verifySession(v string, now time.Time) (string, bool) {
	parts := strings.Split(v, ".")
	if len(parts) != 3 {
		return "", false
	}
	sig, err := b64.DecodeString(parts[2])
	if err != nil || !hmac.Equal(sig, c.mac("session", parts[0], parts[1])) {
		return "", false
	}
	exp, err := strconv.ParseInt(parts[1], 10, 64)
	if err != nil || now.Unix() > exp {
		return "", false
	}
	return parts[0], true
}

// csrfToken is the hidden csrf field of the forms of r's pages.
func (c *Console) csrfToken(r *http.Request) string {
	id, _ := r.Context().Value(ctxKey{}).(identity)
	return b64.EncodeToString(c.mac("csrf", id.session))
}

func (c *Console) csrfOK(r *http.Request) bool {
	got, err := b64.DecodeString(r.PostFormValue("csrf"))
	if err != nil || len(got) == 0 {
		return false
	}
	id, _ := r.Context().Value(ctxKey{}).(identity)
	return hmac.Equal(got, c.mac("csrf", id.session))
}

func (c *Console) loginPage(w http.ResponseWriter, r *http.Request) {
	if c.cfg.Token == "" {
		http.Redirect(w, r, "/", http.StatusSeeOther)
		return
	}
	c.render(w, r, http.StatusOK, "login", page{Title: "Sign in", Data: loginData{Next: safeNext(r.FormValue("next"))}})
}

type loginData struct {
	Next  string
	Error string
}

func (c *Console) login(w http.ResponseWriter, r *http.Request) {
	if c.cfg.Token == "" {
		http.Redirect(w, r, "/", http.StatusSeeOther)
		return
	}
	next := safeNext(r.PostFormValue("next"))
	// Only failures spend the budget.
	if c.limiter.Tokens() < 1 {
		c.render(w, r, http.StatusTooManyRequests, "login", page{Title: "Sign in", Data: loginData{Next: next, Error: "Too many sign-in attempts: wait a second and try again."}})
		return
	}
	if !c.tokenOK(r.PostFormValue("token")) {
		c.limiter.Allow() // spends one attempt
		c.render(w, r, http.StatusUnauthorized, "login", page{Title: "Sign in", Data: loginData{Next: next, Error: "Wrong token."}})
		return
	}
	// Secure only when the browser speaks https: over plain HTTP (loopback,
	// ssh -L) a Secure cookie would never be sent back.
	http.SetCookie(w, &http.Cookie{ //nolint:gosec // G124: Secure is set whenever the browser uses https (overHTTPS)
		Name: cookieName, Value: c.newSession(time.Now()), Path: "/",
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: overHTTPS(r),
		MaxAge: int(sessionTTL / time.Second),
	})
	http.Redirect(w, r, next, http.StatusSeeOther) //nolint:gosec // G710: next went through safeNext, a path on this site only
}

// overHTTPS: the browser speaks https, directly or through a proxy that
// says so (a forged header only makes the cookie stricter).
func overHTTPS(r *http.Request) bool {
	return r.TLS != nil || strings.EqualFold(r.Header.Get("X-Forwarded-Proto"), "https")
}

func (c *Console) logout(w http.ResponseWriter, r *http.Request) {
	http.SetCookie(w, &http.Cookie{Name: cookieName, Value: "", Path: "/", MaxAge: -1, HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: overHTTPS(r)}) //nolint:gosec // G124: as in login
	http.Redirect(w, r, "/login", http.StatusSeeOther)
}

// safeNext keeps a redirect on this site: a path, never a URL with scheme
// or host, nor "//host" or "/\host" (which browsers read as one).
func safeNext(next string) string {
	if next == "" || !strings.HasPrefix(next, "/") || strings.HasPrefix(next, "//") || strings.HasPrefix(next, "/\\") {
		return "/"
	}
	u, err := url.Parse(next)
	if err != nil || u.Scheme != "" || u.Host != "" || u.User != nil || strings.ContainsAny(next, "\\\r\n\t") {
		return "/"
	}
	return next
}
