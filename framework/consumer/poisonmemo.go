package consumer

import (
	"context"
	"fmt"
	"strings"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/internal/pg"
	"github.com/claimtx/claimtx/internal/poison"
)

// requireClaimPrivileges returns a ConfigError on field when the database
// role lacks any of SELECT, INSERT and UPDATE on table (one of the store's
// schema), which every claim transaction uses for feature: each would
// fail (and, the failure being permanent, be dead-lettered), instead of
// one start-up error naming the grant.
func (p *parts) requireClaimPrivileges(ctx context.Context, field, table, uses, feature string) error {
	schema := p.store.Config().Schema
	var lacking []string
	// Under the start-up policy, as the migration before it: Postgres
	// restarting in between is waited for, not a failed start.
	err := awaitDatabase(ctx, p.cfg.Logger, p.cfg.StartupTimeout, p.pool, p.cfg.poolerField(), "check privileges on "+table, func(ctx context.Context) error {
		var err error
		_, lacking, err = pg.Lacking(ctx, p.pool, pg.Ident(schema, table), "SELECT", "INSERT", "UPDATE")
		return err
	})
	if err != nil {
		return err // a *StartupError naming the step
	}
	if len(lacking) > 0 {
		return &framework.ConfigError{Field: field, Reason: fmt.Sprintf(
			"the database role lacks %s on %s.%s, which %s: grant them (docs/security.md) or turn the %s off",
			strings.Join(lacking, ", "), schema, table, uses, feature)}
	}
	return nil
}

// names are the store's table names.
func (p *parts) names() *pg.Names {
	sc := p.store.Config()
	return pg.NewNames(sc.Schema, sc.ClaimsTable, sc.OutboxTable)
}

// checkMemoPrivileges refuses to start a consumer with Claim.PoisonMemo
// whose database role cannot use the memo table, which every claim looks
// its memo up in.
func (p *parts) checkMemoPrivileges(ctx context.Context) error {
	if !p.cfg.Claim.PoisonMemo {
		return nil
	}
	return p.requireClaimPrivileges(ctx, "Claim.PoisonMemo", p.names().Memo,
		"every claim with a poison memo reads and every poisoned message writes", "memo")
}

// checkDeadLetterPrivileges warns at start-up when the database role may
// not insert into the dead-letter table: a poisoned copy the broker
// refuses is then nacked and comes back, instead of being recorded and
// acked. A warning, not a refusal to start: nothing needs the table until
// a broker refuses a copy, and a least-privilege role granted its rights
// before the table existed must not stop consuming over it after an
// upgrade. docs/security.md says what to grant.
func (p *parts) checkDeadLetterPrivileges(ctx context.Context) {
	n := p.names()
	ok, err := pg.ClaimsOf(p.store).CanRecordDeadLetter(ctx)
	if err == nil && ok {
		return
	}
	args := []any{"consumer", p.cfg.Name, "dead_letter_table", n.Schema + "." + n.DeadLetter}
	if err != nil {
		args = append(args, "err", err)
	}
	p.cfg.Logger.Warn("claimtx: the database role cannot insert into the dead-letter table; a poisoned copy the broker refuses will be nacked and come back instead of being recorded (grant INSERT, see docs/security.md)", args...)
}

// memoize records the poison memo of msg (Claim.PoisonMemo), poisoned
// because of err, under key, the key the claim derived ("" when it could
// not: no memo). Both consumer modes call it from Poison.OnPoison, after
// the copy was published and before the original is acked.
//
// A failure is logged and counted (claimtx_poison_memo_errors_total), and
// the original is acked all the same: its copy is in the poison
// destination, so nothing is lost. The same holds for the crash window
// between the publish and this write (a SIGKILL, a lost connection): the
// memo is missing, and the next delivery of the message runs the handler
// again and is poisoned again, as without a memo.
func (p *parts) memoize(msg *message.Message, err error, key string) {
	if !p.claim.PoisonMemo || key == "" || !poison.Memoised(err) {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(msg.Context()), poison.MemoRecordTimeout)
	defer cancel()
	if rerr := pg.ClaimsOf(p.store).RecordMemo(ctx, p.cfg.Name, key, err); rerr != nil {
		p.cfg.Logger.Error("claimtx: poison memo not recorded; the message is in the poison destination, and its next delivery runs the handler again",
			"consumer", p.cfg.Name, "message_uuid", msg.UUID, "err", rerr)
		if p.metrics != nil {
			p.metrics.OnPoisonMemoError(p.cfg.Name)
		}
	}
}
