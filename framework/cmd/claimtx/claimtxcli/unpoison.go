package claimtxcli

import (
	"context"
	"fmt"
	"io"

	"github.com/claimtx/claimtx/internal/pg"
)

func init() {
	synopses["unpoison"] = `Clear poison memos (middleware.Claim.PoisonMemo), so that the next copy of those messages runs the handler again instead of going straight to the poison destination. Conditions combine: every one given must hold; with none, every memo of the consumer is cleared. Prints how many memos were (or, with --dry-run, would be) cleared.

Examples:
  claimtx unpoison --consumer loyalty --key order-completed:9912
  claimtx unpoison --consumer loyalty --reason-contains "customer_id is missing" --dry-run
  claimtx unpoison --consumer loyalty --older-than 7d`
}

// appendTo is the Set of a repeatable string flag (flag.FlagSet.Func).
func appendTo(l *[]string) func(string) error {
	return func(s string) error { *l = append(*l, s); return nil }
}

func cmdUnpoison(ctx context.Context, args []string, stdout, _ io.Writer, getenv env, _ Config) error {
	fs, c := newFlags("unpoison", stdout, getenv)
	var f pg.MemoFilter
	var keys []string
	var olderThan durationValue
	fs.StringVar(&f.Consumer, "consumer", "", "the `consumer` name whose memos to clear (required)")
	fs.Func("key", "clear the memo of this `key` (repeatable)", appendTo(&keys))
	fs.StringVar(&f.ReasonContains, "reason-contains", "", "clear memos whose reason contains this `text` (literally)")
	fs.Var(&olderThan, "older-than", "clear memos last poisoned longer ago than this")
	dryRun := fs.Bool("dry-run", false, "count the memos that would be cleared, clear none")
	if err := c.parse(fs, args); err != nil {
		return err
	}
	if err := requireConsumer("unpoison", f.Consumer); err != nil {
		return err
	}
	for _, k := range keys {
		if k == "" {
			return &usageError{msg: "unpoison: --key must not be empty"}
		}
	}
	if olderThan.d < 0 {
		return &usageError{msg: "unpoison: --older-than must not be negative"}
	}
	f.Keys, f.OlderThan = keys, olderThan.d
	st, closePool, err := c.connect(ctx)
	if err != nil {
		return err
	}
	defer closePool()
	cfg := st.Config()
	n := pg.NewNames(cfg.Schema, cfg.ClaimsTable, cfg.OutboxTable)
	memos := pg.MemosOf(c.pool, n)
	ok, err := memos.Exists(ctx)
	if err != nil {
		return c.fail(ctx, "unpoison", err)
	}
	if !ok {
		return c.fail(ctx, "unpoison", fmt.Errorf("the poison memo table %s.%s does not exist: run `claimtx migrate`, or pass the --schema and --table it belongs to", cfg.Schema, n.Memo))
	}
	clear, done := memos.Clear, "cleared %d poison memos of consumer %s\n"
	if *dryRun {
		clear, done = memos.Count, "dry run: %d poison memos of consumer %s would be cleared\n"
	}
	count, err := clear(ctx, f)
	if err != nil {
		return c.fail(ctx, "unpoison", err)
	}
	printf(stdout, done, count, f.Consumer)
	return nil
}
