package pg

import (
	"fmt"

	"github.com/jackc/pgx/v5"
)

// TxOptions are the options of a claim transaction: pgx's, and the
// synchronous_commit its COMMIT waits for.
type TxOptions struct {
	pgx.TxOptions
	// SynchronousCommit is set for the transaction in the claim's first
	// round trip, beside the lock_timeout; "" sends nothing.
	SynchronousCommit string
}

// The values of middleware.Claim.SynchronousCommit that need a synchronous
// standby to mean what they say.
const (
	SyncRemoteWrite = "remote_write"
	SyncRemoteApply = "remote_apply"
)

// CheckSynchronousCommit returns why v cannot be a claim transaction's
// synchronous_commit, nil when it can. Postgres' synonyms (true, yes, 1)
// are refused, so the setting reads the same wherever it is compared.
func CheckSynchronousCommit(v string) error {
	switch v {
	case "", "on", SyncRemoteWrite, SyncRemoteApply, "local":
		return nil
	case "off", "false", "no", "0":
		return fmt.Errorf("%q is refused: the commit would be acknowledged, and the message acked, before its WAL is flushed, so a database crash could lose an effect whose message the broker has already forgotten", v)
	}
	return fmt.Errorf("must be on, remote_write, remote_apply or local (or empty: the server's default), got %q", v)
}

// NeedsSyncStandby reports whether the synchronous_commit v promises
// durability that only a synchronous standby gives.
func NeedsSyncStandby(v string) bool {
	return v == SyncRemoteWrite || v == SyncRemoteApply
}
