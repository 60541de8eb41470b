package config

import (
	"net/url"
	"regexp"
	"slices"
	"strings"
)

// Mask is what a redacted secret prints as.
const Mask = "xxxxx"

// RedactURL returns rawURL with its password (and secret query values)
// masked; one that does not parse is replaced entirely.
func RedactURL(rawURL string) string {
	if rawURL == "" {
		return ""
	}
	u, err := url.Parse(rawURL)
	if err != nil {
		return "<unparsable URL redacted>"
	}
	if _, has := u.User.Password(); has { // a nil *url.Userinfo has none
		u.User = url.UserPassword(u.User.Username(), Mask)
	}
	q := u.Query()
	changed := false
	for k := range q {
		if SecretName(k) {
			q.Set(k, Mask)
			changed = true
		}
	}
	if changed {
		u.RawQuery = q.Encode()
	}
	return u.String()
}

// SecretName tells whether a key names a secret.
func SecretName(k string) bool {
	k = strings.ToLower(k)
	return strings.Contains(k, "pass") || strings.Contains(k, "secret") || strings.Contains(k, "token")
}

// Redact returns Mask for a non-empty secret, "" for an empty one.
func Redact(s string) string {
	if s == "" {
		return ""
	}
	return Mask
}

// kvPassword finds the password of a keyword/value connection string,
// quoted or not, an unterminated quote included.
var kvPassword = regexp.MustCompile(`password\s*=\s*('(?:[^'\\]|\\.)*'?|\S+)`)

// Passwords returns every spelling of the passwords a connection string may
// hold, even one that does not parse, for whatever prints it to remove.
func Passwords(dsn string) []string {
	var out []string
	if u, err := url.Parse(dsn); err == nil {
		if pw, ok := u.User.Password(); ok {
			out = append(out, pw, url.QueryEscape(pw), url.PathEscape(pw))
		}
		for _, pw := range u.Query()["password"] {
			out = append(out, pw, url.QueryEscape(pw))
		}
	}
	for _, m := range kvPassword.FindAllStringSubmatch(dsn, -1) {
		v := strings.Trim(m[1], "'")
		out = append(out, v, m[1])
		out = append(out, strings.Fields(v)...)
	}
	if at := strings.LastIndex(dsn, "@"); at > 0 {
		if i := strings.Index(dsn, "://"); i >= 0 && i+3 < at {
			if _, pw, ok := strings.Cut(dsn[i+3:at], ":"); ok {
				out = append(out, pw)
			}
		}
	}
	return out
}

// RedactDSN returns a Postgres connection string with its passwords masked,
// by Scrub where it cannot take it apart.
func RedactDSN(dsn string) string {
	if dsn == "" {
		return ""
	}
	out := ""
	if u, err := url.Parse(dsn); err == nil && (u.Scheme == "postgres" || u.Scheme == "postgresql") {
		if _, ok := u.User.Password(); ok {
			u.User = url.UserPassword(u.User.Username(), Mask)
		}
		if q := u.Query(); q.Has("password") {
			q.Set("password", Mask)
			u.RawQuery = q.Encode()
		}
		out = u.String()
	} else if !strings.Contains(dsn, "://") {
		out = kvPassword.ReplaceAllString(dsn, "password="+Mask)
	}
	pws := Passwords(dsn)
	survived := func(pw string) bool { return pw != "" && strings.Contains(out, pw) }
	if out == "" || slices.ContainsFunc(pws, survived) {
		out = Scrub(dsn, pws...) // the blunt way
	}
	return out
}

// Scrub returns s with every non-empty secret in it masked.
func Scrub(s string, secrets ...string) string {
	for _, pw := range secrets {
		if pw != "" {
			s = strings.ReplaceAll(s, pw, Mask)
		}
	}
	return s
}
