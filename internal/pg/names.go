package pg

import (
	"strings"

	"github.com/jackc/pgx/v5"
)

// Names are the schema and table names of one store, rendered into every
// statement the same way whoever runs it. store.Config validates them; they
// are quoted anyway.
type Names struct {
	Schema, Claims, Outbox string
	// Memo, DeadLetter, Parked and ParkedKeys are the claim table's name
	// plus their suffix (at most 48 + 12 bytes, under Postgres's 63).
	Memo, DeadLetter, Parked, ParkedKeys string
	r                                    *strings.Replacer
}

// The poison memo and dead-letter tables are named after their claim
// table: consumer names are unique per claim table, not per schema.
const (
	MemoSuffix       = "_poison_memo"
	DeadLetterSuffix = "_dead_letter"
	ParkedSuffix     = "_parked"
	ParkedKeysSuffix = "_parked_keys"
)

// NewNames returns the names of the claim table claims (and its memo and
// dead-letter tables) and the outbox table outbox in schema. A package
// that needs only one passes "" for the other and must not render
// statements naming it.
func NewNames(schema, claims, outbox string) *Names {
	memo, deadLetter := claims+MemoSuffix, claims+DeadLetterSuffix
	parked, parkedKeys := claims+ParkedSuffix, claims+ParkedKeysSuffix
	return &Names{
		Schema: schema, Claims: claims, Outbox: outbox, Memo: memo, DeadLetter: deadLetter,
		Parked: parked, ParkedKeys: parkedKeys,
		r: strings.NewReplacer(
			"{schema}", Ident(schema),
			"{claims}", Ident(claims),
			"{claims_processed_at_idx}", Ident(claims+"_processed_at_idx"),
			"{memo}", Ident(memo),
			// claims + "_memo_at_idx" fits in 63 bytes; memo + "_…" would not.
			"{memo_poisoned_at_idx}", Ident(claims+"_memo_at_idx"),
			"{dead_letter}", Ident(deadLetter),
			// claims + "_dl_at_idx" fits in 63 bytes, as above.
			"{dead_letter_recorded_at_idx}", Ident(claims+"_dl_at_idx"),
			"{parked}", Ident(parked),
			"{parked_keys}", Ident(parkedKeys),
			"{parked_order_idx}", Ident(claims+"_parked_idx"),
			"{parked_keys_retry_idx}", Ident(claims+"_pk_retry_idx"),
			"{outbox}", Ident(outbox),
			"{outbox_pending_idx}", Ident(outbox+"_pending_idx"),
			"{outbox_sent_idx}", Ident(outbox+"_sent_idx"),
		),
	}
}

// Render substitutes the quoted names for NewNames' placeholders in sql.
func (n *Names) Render(sql string) string { return n.r.Replace(sql) }

// Qualified quotes schema.name for one of claimtx's derived relations
// (partitions, indexes).
func (n *Names) Qualified(name string) string { return Ident(n.Schema, name) }

// Ident quotes an identifier, right by construction should validation
// ever be relaxed.
func Ident(parts ...string) string {
	return pgx.Identifier(parts).Sanitize()
}
