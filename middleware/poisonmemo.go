package middleware

import (
	"context"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/claimtx/claimtx/internal/pg"
	"github.com/claimtx/claimtx/internal/poison"
)

// RecordPoison records the poison memo of msg, just poisoned by err (see
// PoisonMemo): pass it as Poison.OnPoison when you compose the middleware
// yourself.
//
//	claim := middleware.Claim{Store: st, Consumer: "loyalty", Key: key, PoisonMemo: true}
//	poison, err := middleware.NewPoison(middleware.Poison{Publisher: pub, Topic: "order-completed.poison", OnPoison: claim.RecordPoison})
//
// It does nothing unless PoisonMemo is set, nor for a message that cannot
// be keyed or expired. A failure is logged and otherwise harmless: the
// next delivery runs the handler and is poisoned again.
func (c Claim) RecordPoison(msg *message.Message, err error) {
	if !c.PoisonMemo || c.Store == nil || c.Key == nil || msg == nil || !poison.Memoised(err) {
		return
	}
	key, kerr := c.key(msg)
	if kerr != nil || key == "" {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(msg.Context()), poison.MemoRecordTimeout)
	defer cancel()
	if rerr := pg.ClaimsOf(c.Store).RecordMemo(ctx, c.Consumer, key, err); rerr != nil && c.Logger != nil {
		c.Logger.Error("claimtx: poison memo not recorded; the next delivery of the message runs the handler again", rerr,
			watermill.LogFields{"consumer": c.Consumer, "message_uuid": msg.UUID})
	}
}
