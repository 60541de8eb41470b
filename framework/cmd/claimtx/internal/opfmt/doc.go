// Package opfmt shows values the way operators type and read them, for the
// claimtx CLI and the web console alike, so a page and the command it
// mirrors never disagree: durations with days ("30d", "1d12h") besides
// Go's units, retentions as whole days where they are, ages rounded to two
// units ("3d4h", "5h2m", "40s"), producer text squeezed into one table cell,
// when a parked order key is next released,
// and payloads shown as text or base64, cut without splitting a character.
package opfmt
