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

// requireClaimPrivileges refuses (a ConfigError on field) a role that lacks
// privileges (default SELECT, INSERT, UPDATE) on table, which every claim uses for feature:
// better one start-up error than every message dead-lettered.
func (p *parts) requireClaimPrivileges(ctx context.Context, field, table, uses, feature string, privileges ...string) error {
	schema := p.store.Config().Schema
	if len(privileges) == 0 {
		privileges = []string{"SELECT", "INSERT", "UPDATE"}
	}
	var lacking []string
	err := awaitDatabase(ctx, p.cfg.Logger, p.cfg.StartupTimeout, p.pool, p.cfg.poolerField(), "check privileges on "+table, func(ctx context.Context) error {
		var err error
		_, lacking, err = pg.ClaimsOf(p.store).Lacking(ctx, table, privileges...)
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

// checkMemoPrivileges refuses Claim.PoisonMemo to a role without the memo table.
func (p *parts) checkMemoPrivileges(ctx context.Context) error {
	if !p.cfg.Claim.PoisonMemo {
		return nil
	}
	return p.requireClaimPrivileges(ctx, "Claim.PoisonMemo", p.names().Memo,
		"every claim with a poison memo reads and every poisoned message writes", "memo")
}

// checkDeadLetterPrivileges warns, and only warns, when the role may not
// insert into the dead-letter table: a role granted its rights before the
// table existed must not stop consuming after an upgrade.
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

// memoize records msg's poison memo under key ("": none), after the copy
// was published and before the ack. A failure is logged and the original
// acked all the same: the next delivery only runs the handler again.
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
