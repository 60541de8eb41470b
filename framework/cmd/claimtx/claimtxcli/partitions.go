package claimtxcli

import (
	"context"
	"errors"
	"io"
	"time"

	"github.com/claimtx/claimtx/internal/pg"
	"github.com/claimtx/claimtx/store"
)

func init() {
	synopses["partitions list"] = "List the partitions of a partitioned claim table."
	synopses["partitions enable"] = "Convert the claim table to event-day partitions (existing claims are kept as one legacy partition)."
	synopses["partitions create-ahead"] = "Create missing day partitions through today + --ahead days (UTC)."
	synopses["partitions drop-expired"] = "Drop day partitions past the retention window."
}

const partitionsUsage = `Usage: claimtx partitions SUBCOMMAND [flags]

  list           list the partitions of a partitioned claim table
  enable         convert the claim table to event-day partitions
  create-ahead   create missing day partitions through today + --ahead
  drop-expired   drop day partitions past the retention window

Run "claimtx partitions SUBCOMMAND -h" for a subcommand's flags.
`

func cmdPartitions(ctx context.Context, args []string, stdout, _ io.Writer, getenv env, _ Config) error {
	sub, rest, err := subcommand("partitions", partitionsUsage, args, stdout, "list", "enable", "create-ahead", "drop-expired")
	if err != nil {
		return err
	}
	fs, c := newFlags("partitions "+sub, stdout, getenv)
	var cfg store.RetentionConfig
	retention := newRetentionFlags("retention", "min-retention")
	var prepareOnly bool
	// Each subcommand has only the flags it reads.
	if sub != "list" {
		retention.register(fs, &cfg, "claim retention by event time", "refuse a retention below this unless --force", "retention")
		fs.DurationVar(&cfg.LockWait, "lock-wait", pg.DefaultPartitionLockWait, "give up (and retry) a lock wait that would block claims after this")
	}
	if sub == "enable" || sub == "create-ahead" {
		fs.IntVar(&cfg.Ahead, "ahead", pg.DefaultPartitionsAhead, "create partitions through today + this many days (UTC)")
	}
	switch sub {
	case "enable":
		fs.BoolVar(&prepareOnly, "prepare-only", false, "only add event_day and build the indexes online, for a rolling switch to event-time claims")
	case "create-ahead":
		fs.BoolVar(&cfg.DryRun, "dry-run", false, "list the partitions that would be created, create none")
	case "drop-expired":
		fs.BoolVar(&cfg.DryRun, "dry-run", false, "list the partitions that would be dropped, drop none")
	}
	if err := c.parse(fs, rest); err != nil {
		return err
	}
	if err := retention.apply(fs.Name(), &cfg); err != nil {
		return err
	}
	st, closePool, err := c.connect(ctx)
	if err != nil {
		return err
	}
	defer closePool()

	// Not being the leader is no failure, only nothing done.
	failed := func(what string, err error) error {
		if errors.Is(err, store.ErrNotLeader) {
			printf(stdout, "not leader: another process holds the retention lease on %s; nothing done\n", tableName(st))
			return nil
		}
		return c.fail(ctx, what, err)
	}
	switch sub {
	case "list":
		parts, err := st.Partitions(ctx)
		if err != nil {
			return c.fail(ctx, "partitions list", err)
		}
		printPartitions(stdout, parts)
	case "enable":
		if prepareOnly {
			if err := st.PreparePartitioning(ctx, cfg); err != nil {
				return failed("partitions enable --prepare-only", err)
			}
			printf(stdout, "prepared %s: event_day added and indexes built; switch consumers to event-time claims, then run `claimtx partitions enable`\n", tableName(st))
			return nil
		}
		res, err := st.EnablePartitioning(ctx, cfg)
		if err != nil {
			return failed("partitions enable", err)
		}
		switch {
		case res.AlreadyPartitioned:
			printf(stdout, "%s is already partitioned; created %d missing day partitions\n", tableName(st), len(res.Created))
		case res.Legacy:
			printf(stdout, "%s is now partitioned by event day: existing claims kept as %s_legacy (event days before %s), %d day partitions created\n",
				tableName(st), st.Config().ClaimsTable, res.Boundary.Format(time.DateOnly), len(res.Created))
		default:
			printf(stdout, "%s is now partitioned by event day: %d day partitions created\n", tableName(st), len(res.Created))
		}
	case "create-ahead":
		created, err := st.CreatePartitionsAhead(ctx, cfg)
		if err != nil {
			return failed("partitions create-ahead", err)
		}
		printf(stdout, "%s %d partitions\n", dryRunVerb(cfg.DryRun, "created", "would create"), len(created))
		printPartitions(stdout, created)
	case "drop-expired":
		start := time.Now()
		dropped, err := st.DropExpiredPartitions(ctx, cfg)
		if err != nil {
			return failed("partitions drop-expired", err)
		}
		printf(stdout, "%s %d partitions past the %s retention in %s\n", dryRunVerb(cfg.DryRun, "dropped", "would drop"), len(dropped), retention.value.String(), time.Since(start).Round(time.Millisecond))
		printPartitions(stdout, dropped)
	}
	return nil
}

func printPartitions(w io.Writer, parts []store.Partition) {
	if len(parts) == 0 {
		return
	}
	tw := newTable(w)
	printlnTo(tw, "NAME\tEVENT DAYS\tROWS (EST.)\tSIZE")
	for _, p := range parts {
		from := "…"
		if !p.From.IsZero() {
			from = p.From.Format(time.DateOnly)
		}
		days := from + " .. " + p.To.AddDate(0, 0, -1).Format(time.DateOnly)
		if p.From.AddDate(0, 0, 1).Equal(p.To) {
			days = from
		}
		if p.DetachPending {
			days += " (detach pending)"
		}
		printf(tw, "%s\t%s\t%d\t%s\n", p.Name, days, p.EstimatedRows, formatBytes(p.Bytes))
	}
	_ = tw.Flush()
}

func dryRunVerb(dryRun bool, done, would string) string {
	if dryRun {
		return would
	}
	return done
}
