package migrate

import (
	"testing"
	"testing/fstest"

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
