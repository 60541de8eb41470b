// Command claimtx is the operator CLI for claimtx's claim table: schema
// migrations, retention cleanup, partition maintenance, statistics, a
// consumer's dead letters (browse, classify against the claims, replay),
// poison memos, the lineage of a message and the web console. "claimtx
// help" lists the commands, "claimtx COMMAND -h" a command's flags;
// docs/operations.md is the guide.
//
// Exit status: 0 on success (and when not leader), 1 when the operation
// failed (or explain finds nothing), 2 on bad input.
//
// A program of your own serves the same CLI with its extractors: see
// claimtxcli.
package main

import "github.com/claimtx/claimtx/framework/cmd/claimtx/claimtxcli"

func main() { claimtxcli.Main(claimtxcli.Config{}) }
