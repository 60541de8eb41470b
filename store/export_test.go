package store

import "io/fs"

// LoadMigrationsForTest exposes the loader's checks to black-box tests.
func LoadMigrationsForTest(fsys fs.FS) ([]Migration, error) { return loadMigrations(fsys) }
