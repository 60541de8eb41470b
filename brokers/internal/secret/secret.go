// Package secret redacts credentials before anything is printed: config
// String methods, log fields and error messages all go through it.
package secret

import (
	"net/url"
	"strings"
)

// Mask is what a redacted secret prints as.
const Mask = "xxxxx"

// RedactURL returns rawURL with the password of its userinfo replaced by
// Mask. A URL that does not parse is replaced entirely, because url.Parse
// failures are exactly the cases where we cannot tell where the password is.
func RedactURL(rawURL string) string {
	if rawURL == "" {
		return ""
	}
	u, err := url.Parse(rawURL)
	if err != nil {
		return "<unparsable URL redacted>"
	}
	if u.User != nil {
		if _, has := u.User.Password(); has {
			u.User = url.UserPassword(u.User.Username(), Mask)
		}
	}
	// Query parameters may carry credentials too (e.g. auth_mechanism
	// extensions, TLS key passwords): keep names, drop values we do not know.
	q := u.Query()
	changed := false
	for k := range q {
		lk := strings.ToLower(k)
		if strings.Contains(lk, "pass") || strings.Contains(lk, "secret") || strings.Contains(lk, "token") {
			q.Set(k, Mask)
			changed = true
		}
	}
	if changed {
		u.RawQuery = q.Encode()
	}
	// url.URL.String escapes the mask's characters as needed; Mask is plain.
	return u.String()
}

// Redact returns Mask for a non-empty secret and "" for an empty one, so a
// printed config still tells whether a secret was set.
func Redact(s string) string {
	if s == "" {
		return ""
	}
	return Mask
}
