// Command claimtx is the operator CLI for claimtx's claim table: schema
// migrations, retention cleanup, partition maintenance, statistics, a
// consumer's dead letters (browse, classify against the claims, replay),
// poison memos and the lineage of a message.
//
//	claimtx migrate
//	claimtx cleanup [--window 30d] [--dry-run] [--batch-size 5000] …
//	claimtx partitions list | enable [--prepare-only] | create-ahead [--ahead 7] | drop-expired [--dry-run]
//	claimtx stats [--json]
//	claimtx dlq list | inspect | replay [--dry-run] --topic T --consumer C --key-spec SPEC …
//	claimtx keys check --key-spec SPEC [--time-spec SPEC] --topic T | --file F.jsonl
//	claimtx unpoison --consumer C [--key K]… [--reason-contains S] [--older-than D] [--dry-run]
//	claimtx explain --consumer C (--key K | --message FILE --key-spec SPEC) [--json]
//	claimtx console [--listen 127.0.0.1:7070] [--read-only] [--consumer-config FILE]… [--metrics NAME=URL]…
//
// The database comes from --database-url or DATABASE_URL, the schema from
// --schema or CLAIMTX_SCHEMA (default "claimtx"), the table from --table or
// CLAIMTX_TABLE (default "processed_messages"). Every command that deletes
// or drops takes the table's retention lease: run it from cron on
// every instance, and all but one report "not leader" and exit 0.
//
// "claimtx COMMAND -h" prints a command's own flags on stdout; a command
// refuses another command's flags.
//
// Exit status: 0 on success (and when not leader), 1 when the operation
// failed (and when explain finds neither claim nor poison memo), 2 on bad input (unknown command, bad flag, a retention window
// below the minimum). Interrupting a cleanup (Ctrl-C, SIGTERM) stops after
// the current batch; run it again to resume.
//
// This binary is claimtxcli with the built-in extractors; a program of
// your own serves the same CLI with its extractors (see claimtxcli).
package main

import "github.com/claimtx/claimtx/framework/cmd/claimtx/claimtxcli"

func main() { claimtxcli.Main(claimtxcli.Config{}) }
