package middleware

import (
	"context"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/claimtx/claimtx/internal/pg"
	"github.com/claimtx/claimtx/internal/poison"
)

// RecordPoison records the poison memo of msg, which was just published
// to the poison destination because of err (see PoisonMemo): pass it as
// the Poison middleware's OnPoison when you compose the middleware
// yourself (framework/consumer records memos on its own).
//
//	claim := middleware.Claim{Store: st, Consumer: "loyalty", Key: key, PoisonMemo: true}
//	poison, err := middleware.NewPoison(middleware.Poison{Publisher: pub, Topic: "order-completed.poison", OnPoison: claim.RecordPoison})
//
// It does nothing unless PoisonMemo is set, and nothing for a message
// that cannot be keyed or was poisoned as expired. A failure to record is
// logged at error on Logger and otherwise ignored: the copy is already in
// the poison destination, so nothing is lost; the next delivery of the
// message runs the handler again and is poisoned again.
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
