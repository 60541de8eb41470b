// Package standby reads whether a Postgres server has the synchronous
// standby that a claim committed with synchronous_commit remote_write or
// remote_apply relies on: without one, a failover can lose an acked effect.
package standby

import (
	"context"
	"fmt"
	"strings"

	"github.com/claimtx/claimtx/internal/pg"
)

// State is what the server says about its synchronous replication.
type State struct {
	// Names is synchronous_standby_names.
	Names string
	// Standbys counts the WAL senders of pg_stat_replication, Sync those
	// whose sync_state is sync or quorum, and Hidden those whose
	// sync_state the role cannot read (without pg_read_all_stats).
	Standbys, Sync, Hidden int
}

// readSQL reads State; every role sees a row per WAL sender.
const readSQL = `SELECT current_setting('synchronous_standby_names'), count(*),
	count(*) FILTER (WHERE sync_state IN ('sync', 'quorum')),
	count(*) FILTER (WHERE sync_state IS NULL)
FROM pg_stat_replication`

// Read reads the server's State.
func Read(ctx context.Context, db pg.Querier) (State, error) {
	var s State
	err := db.QueryRow(ctx, readSQL).Scan(&s.Names, &s.Standbys, &s.Sync, &s.Hidden)
	return s, pg.Wrap(err, "claimtx: read synchronous replication state")
}

// Shortfall says what s lacks for commits with synchronousCommit to keep
// their promise, "" when nothing. verified is false when the role could
// not read which standbys are synchronous.
func (s State) Shortfall(synchronousCommit string) (shortfall string, verified bool) {
	if !pg.NeedsSyncStandby(synchronousCommit) {
		return "", true
	}
	switch {
	case strings.TrimSpace(s.Names) == "":
		return fmt.Sprintf("synchronous_commit %s needs a synchronous standby, but synchronous_standby_names is empty: "+
			"commits are acknowledged without a synchronous standby: a failover can lose acknowledged effects", synchronousCommit), true
	case s.Sync > 0:
		return "", true
	case s.Hidden > 0:
		// Every row hides its sync_state alike: nothing more to tell.
		return "", false
	}
	return fmt.Sprintf("synchronous_commit %s needs a synchronous standby; synchronous_standby_names is %q, but none of the %d connected standbys is synchronous (pg_stat_replication): "+
		"commits wait until one is, so claims stall", synchronousCommit, s.Names, s.Standbys), true
}
