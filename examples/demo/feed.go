// The demo's own settings; what it knows about the loyalty example is in
// examples/loyalty/feed.

package main

import (
	"errors"
	"net/url"
	"os"
)

// withSearchPath returns dbURL with search_path set to schema, so the
// consumer's effect tables land in the run's own schema.
func withSearchPath(dbURL, schema string) (string, error) {
	u, err := url.Parse(dbURL)
	if err != nil {
		// The error would quote the URL, password included.
		return "", errors.New("DATABASE_URL does not parse")
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	return u.String(), nil
}

// envOr returns the environment variable name, or def when it is unset or
// empty.
func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}
