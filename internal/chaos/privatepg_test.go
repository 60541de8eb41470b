//go:build chaos || disruptive

package chaos

import (
	"net/url"
	"strconv"
	"testing"

	"github.com/claimtx/claimtx/internal/testenv"
)

// usePrivatePostgres starts the private cluster when -pg-restart asks for
// it and points the run at it.
func usePrivatePostgres(t testing.TB, o *options) {
	if o.pgRestart != privatePostgres {
		return
	}
	o.pgCluster = testenv.StartPGCluster(t)
	o.databaseURL = o.pgCluster.URL("postgres")
}

// usePgBouncer starts the run's PgBouncer, when -pgbouncer asks for it,
// in front of the run's Postgres (the private cluster, if any: call it
// after usePrivatePostgres). A Postgres restart then breaks PgBouncer's
// server connections too, as it does in production.
func usePgBouncer(t testing.TB, o *options) {
	if !o.pgbouncer {
		return
	}
	u, err := url.Parse(o.databaseURL)
	if err != nil {
		t.Fatal("chaos: DATABASE_URL does not parse")
	}
	port := 5432
	if p := u.Port(); p != "" {
		if port, err = strconv.Atoi(p); err != nil {
			t.Fatalf("chaos: DATABASE_URL port %q", p)
		}
	}
	b, err := url.Parse(testenv.StartPgBouncer(t, u.Hostname(), port))
	if err != nil {
		t.Fatalf("chaos: PgBouncer URL: %v", err)
	}
	o.pgbouncerHost = b.Host
}
