//go:build chaos || disruptive

package chaos

import (
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
