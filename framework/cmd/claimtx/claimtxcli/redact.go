package claimtxcli

import (
	"github.com/jackc/pgx/v5"

	"github.com/claimtx/claimtx/internal/config"
)

// redactedError is an error without passwords that unwraps to the
// original, so sentinel errors stay matchable.
type redactedError struct {
	msg string
	err error
}

func (e *redactedError) Error() string { return e.msg }
func (e *redactedError) Unwrap() error { return e.err }

// redact removes the database password from s: every spelling in the
// URL, and the one pgx would use (maybe from PGPASSWORD or a password
// file).
func (c *common) redact(s string) string {
	secrets := config.Passwords(c.databaseURL)
	if cfg, err := pgx.ParseConfig(c.databaseURL); err == nil {
		secrets = append(secrets, cfg.Password)
	}
	return config.Scrub(s, secrets...)
}
