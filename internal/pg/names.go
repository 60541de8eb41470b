package pg

// Names renders claimtx's table names into SQL. The store, the
// claim and outbox statements (store/internal/claimsql, store/internal/outboxsql) and
// the migrations (internal/migrate) share it, so every statement names the
// tables the same way whoever runs it.

import (
	"strings"

	"github.com/jackc/pgx/v5"
)

// Names are the schema and table names of one store. store.Config
// validates them (a strict lower-case pattern); they are quoted anyway.
type Names struct {
	Schema, Claims, Outbox string
	// Memo is the poison memo table of the claim table: its name plus
	// MemoSuffix (at most 48 + 12 bytes, under Postgres's 63).
	Memo string
	// DeadLetter is the dead-letter table of the claim table: its name
	// plus DeadLetterSuffix (at most 48 + 12 bytes).
	DeadLetter string
	r          *strings.Replacer
}

// MemoSuffix names the poison memo table after its claim table: the memos
// belong to the claims of one table (consumer names are unique per claim
// table, not per schema) and share its retention.
const MemoSuffix = "_poison_memo"

// DeadLetterSuffix names the dead-letter table after its claim table, as
// MemoSuffix does the memo table: it keeps the messages of that table's
// consumers whose poisoned copy the broker refused.
const DeadLetterSuffix = "_dead_letter"

// NewNames returns the names of the claim table claims (and its poison memo
// table) and the outbox table outbox in schema. A package that needs only
// one of the tables passes "" for the other and must not render
// statements naming it.
func NewNames(schema, claims, outbox string) *Names {
	memo, deadLetter := claims+MemoSuffix, claims+DeadLetterSuffix
	return &Names{
		Schema: schema, Claims: claims, Outbox: outbox, Memo: memo, DeadLetter: deadLetter,
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
			"{outbox}", Ident(outbox),
			"{outbox_pending_idx}", Ident(outbox+"_pending_idx"),
			"{outbox_sent_idx}", Ident(outbox+"_sent_idx"),
		),
	}
}

// Render substitutes the quoted names for the placeholders {schema},
// {claims}, {claims_processed_at_idx}, {memo}, {memo_poisoned_at_idx},
// {dead_letter}, {dead_letter_recorded_at_idx}, {outbox},
// {outbox_pending_idx} and {outbox_sent_idx} in sql.
func (n *Names) Render(sql string) string { return n.r.Replace(sql) }

// Qualified quotes schema.name for one of claimtx's derived relations
// (partitions, indexes).
func (n *Names) Qualified(name string) string { return Ident(n.Schema, name) }

// Ident quotes an identifier. Validation already rules out quotes; pgx's
// Sanitize is used anyway so that the quoting is right by construction
// should the pattern ever be relaxed.
func Ident(parts ...string) string {
	return pgx.Identifier(parts).Sanitize()
}
