package migrate

import (
	"errors"
	"fmt"
	"testing"
	"testing/fstest"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
)

func TestDuplicateMigrationVersionRefused(t *testing.T) {
	t.Parallel()
	_, err := Load(fstest.MapFS{
		"migrations/001_a.up.sql": {Data: []byte("SELECT 1")},
		"migrations/001_b.up.sql": {Data: []byte("SELECT 2")},
	})
	require.ErrorContains(t, err, "used by both")
	_, err = Load(fstest.MapFS{"migrations/002_a.up.sql": {Data: []byte("SELECT 1")}})
	require.ErrorContains(t, err, "without gaps")
	_, err = Load(fstest.MapFS{"migrations/x.sql": {Data: []byte("")}})
	require.Error(t, err)
}

func TestEmbeddedMigrations(t *testing.T) {
	t.Parallel()
	require.Equal(t, len(migrations), Latest())
	for _, m := range migrations {
		require.NotEmpty(t, m.down, "migration %d has no down file", m.Version)
	}
}

// What a stale catalog cache makes CREATE … IF NOT EXISTS return is tried
// again; anything else (a missing privilege, a cancelled context) is not.
func TestStaleCatalog(t *testing.T) {
	t.Parallel()
	for code, want := range map[string]bool{"23505": true, "42P06": true, "42P07": true, "42501": false, "57014": false} {
		err := fmt.Errorf("claimtx: create migration table: %w", &pgconn.PgError{Code: code})
		require.Equal(t, want, staleCatalog(err), code)
	}
	require.False(t, staleCatalog(errors.New("connection reset")))
	require.False(t, staleCatalog(nil))
}
