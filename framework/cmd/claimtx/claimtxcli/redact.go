package claimtxcli

// The CLI's redaction of passwords from what it prints, through the one
// redactor of connection-string passwords (internal/config).

import (
	"github.com/jackc/pgx/v5"

	"github.com/claimtx/claimtx/internal/config"
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
// prints: every spelling config.Passwords finds in the connection string,
// and the password pgx would use, which may come from PGPASSWORD or a
// password file rather than the string. pgx already redacts its own parse
// errors; this is the second belt.
func (c *common) redact(s string) string {
	secrets := config.Passwords(c.databaseURL)
	if cfg, err := pgx.ParseConfig(c.databaseURL); err == nil {
		secrets = append(secrets, cfg.Password)
	}
	return config.Scrub(s, secrets...)
}
