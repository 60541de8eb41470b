package store

import (
	"cmp"
	"fmt"
	"regexp"
	"strings"

	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/internal/pg"
)

// Stricter than Postgres: lower case only, so no case folding, and short
// enough that derived names ("<table>_pYYYYMMDD") stay under Postgres's
// 63-byte limit instead of being silently truncated.
var (
	schemaName = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)
	tableName  = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,47}$`)
)

// Config names where claimtx keeps its tables. Names are validated against a
// strict pattern and always quoted, so they can never inject SQL.
type Config struct {
	// Schema holds every claimtx table. It is created by Migrate when
	// missing. Defaults to "claimtx".
	Schema string `yaml:"schema"`
	// ClaimsTable is the claim table's name inside Schema. It is fixed by
	// the first Migrate: renaming it later is a manual migration.
	// Defaults to "processed_messages".
	ClaimsTable string `yaml:"claims_table"`
	// OutboxTable is the transactional outbox's table inside Schema (see
	// Store.Enqueue and package store/outbox). Like ClaimsTable it is fixed
	// by the first Migrate. Defaults to "outbox".
	OutboxTable string `yaml:"outbox_table"`
}

func (c Config) withDefaults() Config {
	c.Schema = cmp.Or(c.Schema, pg.DefaultSchema)
	c.ClaimsTable = cmp.Or(c.ClaimsTable, pg.DefaultClaimsTable)
	c.OutboxTable = cmp.Or(c.OutboxTable, pg.DefaultOutboxTable)
	return c
}

// Validate reports the first invalid field as a *framework.ConfigError.
// Empty fields are valid: they take their defaults.
func (c Config) Validate() error {
	c = c.withDefaults()
	for _, f := range []struct {
		field  string
		bad    bool
		reason string
	}{
		{"Schema", !schemaName.MatchString(c.Schema), fmt.Sprintf("%q must match %s", c.Schema, schemaName)},
		{"Schema", strings.HasPrefix(c.Schema, "pg_") || c.Schema == "information_schema", fmt.Sprintf("%q is reserved by Postgres (pg_* and information_schema)", c.Schema)},
		{"ClaimsTable", !tableName.MatchString(c.ClaimsTable), fmt.Sprintf("%q must match %s", c.ClaimsTable, tableName)},
		{"OutboxTable", !tableName.MatchString(c.OutboxTable), fmt.Sprintf("%q must match %s", c.OutboxTable, tableName)},
		{"OutboxTable", c.OutboxTable == c.ClaimsTable, fmt.Sprintf("%q is also the ClaimsTable", c.OutboxTable)},
		{"OutboxTable", c.OutboxTable == c.ClaimsTable+pg.MemoSuffix, fmt.Sprintf("%q is the poison memo table of ClaimsTable %q", c.OutboxTable, c.ClaimsTable)},
		{"OutboxTable", c.OutboxTable == c.ClaimsTable+pg.DeadLetterSuffix, fmt.Sprintf("%q is the dead-letter table of ClaimsTable %q", c.OutboxTable, c.ClaimsTable)},
		{"OutboxTable", c.OutboxTable == c.ClaimsTable+pg.ParkedSuffix || c.OutboxTable == c.ClaimsTable+pg.ParkedKeysSuffix, fmt.Sprintf("%q is a parking table of ClaimsTable %q", c.OutboxTable, c.ClaimsTable)},
	} {
		if f.bad {
			return &framework.ConfigError{Field: f.field, Reason: f.reason}
		}
	}
	return nil
}
