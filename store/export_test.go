package store

import "io/fs"

// LoadMigrationsForTest exposes the loader's checks to black-box tests.
func LoadMigrationsForTest(fsys fs.FS) ([]Migration, error) { return loadMigrations(fsys) }

// MigrationLockKeyForTest is the advisory lock key Migrate takes.
func (s *Store) MigrationLockKeyForTest() int64 { return s.migrationLockKey() }
