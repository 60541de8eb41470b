// Package framework is claimtx's vocabulary: how a message becomes a
// deduplication key and an event time, what can happen to a message
// (Outcome), how a handler reaches the claim transaction, and the errors
// callers branch on. Every claimtx package speaks it; besides the standard
// library it imports only Watermill's message package and pgx (for the
// pgx.Tx a handler gets), never a broker client.
//
// Keys and event times are built from the spec strings configuration uses
// (metadata:NAME, json:PATH, template:TEXT, first:SPEC|SPEC...,
// kafka:timestamp; see ExampleParseKeySpec); a Registry adds named
// extractors for what a spec cannot say, and KeyPolicy validates derived
// keys. Errors are typed (branch with errors.As); Permanent marks one
// retrying cannot fix. docs/configuration.md lists the specs, docs/design.md
// says why keys are injective and linear in the payload, docs/operations.md
// covers event times and the expiry guard.
package framework
