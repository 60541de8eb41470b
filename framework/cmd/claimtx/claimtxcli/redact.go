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

// redact removes the database password from s.
func (c *common) redact(s string) string { return config.Scrub(s, dbPasswords(c.databaseURL)...) }

// dbPasswords are every spelling of the password in dsn, and the one pgx
// would use (maybe from PGPASSWORD or a password file).
func dbPasswords(dsn string) []string {
	out := config.Passwords(dsn)
	if cfg, err := pgx.ParseConfig(dsn); err == nil {
		out = append(out, cfg.Password)
	}
	return out
}
