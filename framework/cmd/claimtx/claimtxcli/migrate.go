package claimtxcli

import (
	"context"
	"github.com/claimtx/claimtx/store"
	"io"
)

func init() {
	synopses["migrate"] = "Create or upgrade claimtx's schema; safe to run on every host at deploy."
}

func cmdMigrate(ctx context.Context, args []string, stdout, _ io.Writer, getenv env, _ Config) error {
	fs, c := newFlags("migrate", stdout, getenv)
	if err := c.parse(fs, args); err != nil {
		return err
	}
	st, closePool, err := c.connect(ctx)
	if err != nil {
		return err
	}
	defer closePool()
	before, err := st.Version(ctx)
	if err != nil {
		return c.fail(ctx, "migrate", err)
	}
	// Migrate runs even when up to date: it is the one that knows.
	if err := st.Migrate(ctx); err != nil {
		return c.fail(ctx, "migrate", err)
	}
	if before == store.SchemaVersion {
		printf(stdout, "schema %s is already at version %d, the latest; nothing to do\n", st.Config().Schema, before)
		return nil
	}
	printf(stdout, "migrated schema %s to version %d (was %d)\n", st.Config().Schema, store.SchemaVersion, before)
	return nil
}
