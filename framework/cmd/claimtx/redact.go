package main

// The CLI's redaction of passwords from what it prints. redactDSN is the
// one place that knows the spellings of a Postgres connection string's
// password; framework/consumer/loadconfig.go has its own copy (kvPassword),
// for the shared redactor to replace both.

import (
	"net/url"
	"regexp"
	"strings"

	"github.com/jackc/pgx/v5"
)

// redactedError is an error whose text has had the passwords removed; it
// unwraps to the original, so sentinel errors stay matchable.
type redactedError struct {
	msg string
	err error
}

func (e *redactedError) Error() string { return e.msg }
func (e *redactedError) Unwrap() error { return e.err }

// redact removes the database password from s, for every message the CLI
// prints.
func (c *common) redact(s string) string { return redactDSN(c.databaseURL, s) }

var keywordPassword = regexp.MustCompile(`password\s*=\s*('(?:[^'\\]|\\.)*'|\S+)`)

// redactDSN removes every spelling of the connection string dsn's password
// from s: the URL's user info (raw and escaped), a password query
// parameter, a keyword/value password='...', and what pgx parses out. pgx
// already redacts its own parse errors; this is the second belt.
func redactDSN(dsn, s string) string {
	var secrets []string
	if u, err := url.Parse(dsn); err == nil && u.User != nil {
		if p, ok := u.User.Password(); ok {
			secrets = append(secrets, p, url.QueryEscape(p), url.PathEscape(p))
		}
		if p := u.Query().Get("password"); p != "" {
			secrets = append(secrets, p, url.QueryEscape(p))
		}
	}
	for _, m := range keywordPassword.FindAllStringSubmatch(dsn, -1) {
		secrets = append(secrets, strings.Trim(m[1], "'"), m[1])
	}
	if cfg, err := pgx.ParseConfig(dsn); err == nil && cfg.Password != "" {
		secrets = append(secrets, cfg.Password)
	}
	for _, p := range secrets {
		if len(p) >= 1 {
			s = strings.ReplaceAll(s, p, "xxxxx")
		}
	}
	return s
}
