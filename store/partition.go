package store

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"sort"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/claimtx/claimtx/internal/pg"
	"github.com/claimtx/claimtx/store/internal/claimsql"
)

const (
	partitionDayLayout         = "20060102"
	legacyBoundaryDaysAhead    = 2
	maxPartitionsAhead         = 366
	partitionLockRetryInterval = 200 * time.Millisecond
)

// Errors of the partition API, matched with errors.Is.
var (
	// ErrNoPartition is returned by a claim with ClaimRequest.EventTime
	// when no partition accepts the message's event day: it is older than
	// the retention horizon (the message is expired) or further ahead than
	// partitions were created. The message must not be applied.
	ErrNoPartition = claimsql.ErrNoPartition
	// ErrNotPartitioned is returned by partition maintenance on a plain
	// claim table (see EnablePartitioning).
	ErrNotPartitioned = errors.New("claimtx: the claim table is not partitioned (enable partitioning first)")
)

// Partition is one partition of the claim table.
type Partition struct {
	Name string
	// From is the first event day it holds; zero for the legacy partition
	// (the rows from before EnablePartitioning), which holds every day
	// before To.
	From time.Time
	// To is the first event day it no longer holds (zero for a legacy
	// partition found detached but not dropped).
	To time.Time
	// DetachPending is true when a concurrent detach was interrupted; the
	// next DropExpiredPartitions finishes it.
	DetachPending bool
	EstimatedRows int64 // the planner's row count (0 until analysed)
	Bytes         int64 // total size, indexes included
}

// PartitioningResult reports what EnablePartitioning did.
type PartitioningResult struct {
	// AlreadyPartitioned is true when the table was partitioned before the
	// call; only missing days were created.
	AlreadyPartitioned bool
	// Legacy is true when existing claims were kept as the legacy
	// partition (an empty table is simply replaced).
	Legacy bool
	// Boundary is the first event day served by day partitions; earlier
	// days go to the legacy partition. Zero when there is none.
	Boundary time.Time
	Created  []Partition // the day partitions created
}

func (s *Store) legacyName() string { return s.cfg.ClaimsTable + "_legacy" }

func (s *Store) dayName(day time.Time) string {
	return s.cfg.ClaimsTable + "_p" + day.Format(partitionDayLayout)
}

func (s *Store) dayPartition(day time.Time) Partition {
	return Partition{Name: s.dayName(day), From: day, To: day.AddDate(0, 0, 1)}
}

var partitionBound = regexp.MustCompile(`^FOR VALUES FROM \((MINVALUE|'(\d{4}-\d{2}-\d{2})')\) TO \('(\d{4}-\d{2}-\d{2})'\)$`)

// Partitions lists the claim table's partitions, oldest first.
func (s *Store) Partitions(ctx context.Context) ([]Partition, error) {
	if err := s.requirePartitioned(ctx, s.pool); err != nil {
		return nil, err
	}
	return s.partitions(ctx, s.pool)
}

// partitions reads them on db, the pool or a connection.
func (s *Store) partitions(ctx context.Context, db interface {
	BeginTx(context.Context, pgx.TxOptions) (pgx.Tx, error)
}) ([]Partition, error) {
	var parts []Partition
	err := pgx.BeginTxFunc(ctx, db, pgx.TxOptions{AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		// Bounds are parsed as text: independent of the server's DateStyle.
		if _, err := tx.Exec(ctx, "SET LOCAL DateStyle = 'ISO, YMD'"); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, `SELECT c.relname, pg_get_expr(c.relpartbound, c.oid), i.inhdetachpending,
       greatest(c.reltuples, 0)::bigint, pg_total_relation_size(c.oid)
FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
WHERE i.inhparent = $1::regclass`, s.names.Render("{schema}.{claims}"))
		if err != nil {
			return err
		}
		parts, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (p Partition, err error) {
			var bound string
			if err := row.Scan(&p.Name, &bound, &p.DetachPending, &p.EstimatedRows, &p.Bytes); err != nil {
				return p, err
			}
			m := partitionBound.FindStringSubmatch(bound)
			if m == nil {
				return p, fmt.Errorf("partition %q has bound %q, which claimtx did not create", p.Name, bound)
			}
			if m[2] != "" {
				if p.From, err = time.Parse(time.DateOnly, m[2]); err != nil {
					return p, err
				}
			}
			p.To, err = time.Parse(time.DateOnly, m[3])
			return p, err
		})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("claimtx: list partitions: %w", err)
	}
	sort.Slice(parts, func(i, j int) bool { return parts[i].To.Before(parts[j].To) })
	return parts, nil
}

// days returns today and the horizon day (UTC) on the database clock: the
// day containing now minus retention, whose partition and every later one
// may still hold claims inside the window.
func (s *Store) days(ctx context.Context, q pg.Querier, retention time.Duration) (today, horizonDay time.Time, err error) {
	err = q.QueryRow(ctx, `SELECT (now() AT TIME ZONE 'UTC')::date, ((now() - $1 * interval '1 microsecond') AT TIME ZONE 'UTC')::date`,
		retention.Microseconds()).Scan(&today, &horizonDay)
	return today.UTC(), horizonDay.UTC(), pg.Wrap(err, "claimtx: read database clock")
}

// PreparePartitioning runs the online first half of EnablePartitioning on
// a plain claim table: it adds event_day (-infinity for claims without an
// event time, so both kinds of consumer keep deduplicating against each
// other) and builds CONCURRENTLY the legacy partition's unique indexes.
// Idempotent and resumable. Until EnablePartitioning, every claim
// maintains two more indexes: do not linger in between.
func (s *Store) PreparePartitioning(ctx context.Context, cfg RetentionConfig) error {
	_, err := underRetentionLock(ctx, s, cfg, false, func(ctx context.Context, conn *pgxpool.Conn, cfg RetentionConfig) (struct{}, error) {
		kind, err := s.claimTableKind(ctx, conn)
		if err != nil || kind == "p" {
			return struct{}{}, err
		}
		return struct{}{}, s.prepare(ctx, conn, cfg)
	})
	return err
}

// underRetentionLock validates cfg, applies its defaults and runs fn (with
// partitioned, only on a partitioned table) under the retention lease, so
// no two maintenance runs interleave their DDL. fn renews the lease in
// each transaction (ddlTx) and statement outside one (execRenewed).
func underRetentionLock[T any](ctx context.Context, s *Store, cfg RetentionConfig, partitioned bool,
	fn func(context.Context, *pgxpool.Conn, RetentionConfig) (T, error),
) (_ T, err error) {
	var zero T
	if err := cfg.validatePartitioned(); err != nil {
		return zero, err
	}
	cfg = cfg.withDefaults()
	ctx, conn, l, err := s.lockRetention(ctx)
	if err != nil {
		return zero, err
	}
	defer l.release(&err)
	if partitioned {
		if err := s.requirePartitioned(ctx, conn); err != nil {
			return zero, err
		}
	}
	return fn(ctx, conn, cfg)
}

func (s *Store) prepare(ctx context.Context, conn *pgxpool.Conn, cfg RetentionConfig) error {
	hasColumn, err := s.hasEventDay(ctx, conn)
	if err != nil {
		return err
	}
	if !hasColumn {
		err := s.ddlTx(ctx, conn, cfg, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, s.names.Render("ALTER TABLE {schema}.{claims} ADD COLUMN IF NOT EXISTS event_day date NOT NULL DEFAULT '-infinity'"))
			return err
		})
		if err != nil {
			return fmt.Errorf("claimtx: prepare partitioning: add event_day: %w", err)
		}
	}
	for _, idx := range []struct{ name, cols string }{
		{s.cfg.ClaimsTable + "_legacy_key", "consumer, message_key"},
		{s.cfg.ClaimsTable + "_legacy_pkey", "consumer, message_key, event_day"},
	} {
		var valid *bool
		err := conn.QueryRow(ctx, `SELECT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1 AND c.relname = $2`, s.cfg.Schema, idx.name).Scan(&valid)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("claimtx: prepare partitioning: inspect index %s: %w", idx.name, err)
		}
		if valid != nil && *valid {
			continue
		}
		if valid != nil { // left invalid by an interrupted concurrent build
			if err := execRenewed(ctx, conn, "DROP INDEX CONCURRENTLY IF EXISTS "+s.names.Qualified(idx.name),
				"prepare partitioning: drop invalid index "+idx.name); err != nil {
				return err
			}
		}
		// CONCURRENTLY takes no lock that blocks claims; it waits for
		// running transactions instead, so no lock_timeout here.
		if err := execRenewed(ctx, conn, "CREATE UNIQUE INDEX CONCURRENTLY "+pg.Ident(idx.name)+" ON "+s.names.Render("{schema}.{claims}")+" ("+idx.cols+")",
			"prepare partitioning: build index "+idx.name); err != nil {
			return err
		}
	}
	return nil
}

// EnablePartitioning converts the claim table to partitioned mode (range
// partitioned by event_day, primary key (consumer, message_key,
// event_day)); consumers must then claim with ClaimRequest.EventTime. An
// opt-in, not a migration: it changes what every consumer must send.
// Existing claims are not copied: the old table becomes the legacy
// partition (every event day before today + 2, UTC), whose unique
// (consumer, message_key) index still catches redeliveries; an empty table
// gets day partitions from the horizon on. Grants, views and foreign keys
// naming the old table follow it to <table>_legacy: re-create them.
// Idempotent: on a partitioned table it only creates missing days.
// docs/operations.md ("Migrating an existing table") has the steps.
func (s *Store) EnablePartitioning(ctx context.Context, cfg RetentionConfig) (PartitioningResult, error) {
	return underRetentionLock(ctx, s, cfg, false, s.enablePartitioning)
}

func (s *Store) enablePartitioning(ctx context.Context, conn *pgxpool.Conn, cfg RetentionConfig) (PartitioningResult, error) {
	var res PartitioningResult
	kind, err := s.claimTableKind(ctx, conn)
	if err != nil {
		return res, err
	}
	if kind == "p" {
		res.AlreadyPartitioned = true
		res.Created, err = s.createAhead(ctx, conn, cfg)
		return res, err
	}
	if err := s.prepare(ctx, conn, cfg); err != nil {
		return res, err
	}
	today, horizonDay, err := s.days(ctx, conn, cfg.Retention)
	if err != nil {
		return res, err
	}
	boundary := today.AddDate(0, 0, legacyBoundaryDaysAhead)
	boundName := pg.Ident(s.cfg.ClaimsTable + "_legacy_bound")
	err = s.ddlTx(ctx, conn, cfg, func(tx pgx.Tx) error {
		// A constraint left by an interrupted run may name an older
		// boundary: replace it.
		_, err := tx.Exec(ctx, s.names.Render("ALTER TABLE {schema}.{claims} DROP CONSTRAINT IF EXISTS "+boundName+
			", ADD CONSTRAINT "+boundName+" CHECK (event_day < "+dateLiteral(boundary)+") NOT VALID"))
		return err
	})
	if err != nil {
		return res, fmt.Errorf("claimtx: enable partitioning: add boundary constraint: %w", err)
	}
	if err := execRenewed(ctx, conn, s.names.Render("ALTER TABLE {schema}.{claims} VALIDATE CONSTRAINT "+boundName),
		fmt.Sprintf("enable partitioning: claims with an event day on or after %s exist (event times written ahead of the clock); retry tomorrow",
			boundary.Format(time.DateOnly))); err != nil {
		return res, err
	}

	err = s.ddlTx(ctx, conn, cfg, func(tx pgx.Tx) error {
		res = PartitioningResult{}
		var pk string
		if err := tx.QueryRow(ctx, "SELECT conname FROM pg_constraint WHERE conrelid = $1::regclass AND contype = 'p'", s.names.Render("{schema}.{claims}")).Scan(&pk); err != nil {
			return fmt.Errorf("find primary key: %w", err)
		}
		legacyPK := s.cfg.ClaimsTable + "_legacy_pkey"
		stmts := []string{}
		if pk != legacyPK {
			stmts = append(stmts, s.names.Render("ALTER TABLE {schema}.{claims} DROP CONSTRAINT "+pg.Ident(pk)+
				", ADD CONSTRAINT "+pg.Ident(legacyPK)+" PRIMARY KEY USING INDEX "+pg.Ident(legacyPK)))
		}
		stmts = append(stmts,
			s.names.Render("ALTER TABLE {schema}.{claims} RENAME TO "+pg.Ident(s.legacyName())),
			// LIKE copies every column (including any added by later
			// migrations) and its defaults; not the CHECK constraints.
			s.names.Render("CREATE TABLE {schema}.{claims} (LIKE "+s.names.Qualified(s.legacyName())+" INCLUDING DEFAULTS, CONSTRAINT "+
				pg.Ident(s.cfg.ClaimsTable+"_pkey")+" PRIMARY KEY (consumer, message_key, event_day)) PARTITION BY RANGE (event_day)"),
			// No default: a claim without an event day must fail, not
			// land in some partition.
			s.names.Render("ALTER TABLE {schema}.{claims} ALTER COLUMN event_day DROP DEFAULT"),
			s.names.Render("COMMENT ON TABLE {schema}.{claims} IS 'claimtx claims, range partitioned by event_day: the UTC day of the producer''s event time'"),
		)
		for _, q := range stmts {
			if _, err := tx.Exec(ctx, q); err != nil {
				return err
			}
		}
		var empty bool
		if err := tx.QueryRow(ctx, "SELECT NOT EXISTS (SELECT 1 FROM "+s.names.Qualified(s.legacyName())+")").Scan(&empty); err != nil {
			return err
		}
		lower, legacy := horizonDay, "DROP TABLE "+s.names.Qualified(s.legacyName())
		if !empty {
			legacy = s.names.Render("ALTER TABLE {schema}.{claims} ATTACH PARTITION " + s.names.Qualified(s.legacyName()) +
				" FOR VALUES FROM (MINVALUE) TO (" + dateLiteral(boundary) + ")")
			res.Legacy, res.Boundary, lower = true, boundary, boundary
		}
		if _, err := tx.Exec(ctx, legacy); err != nil {
			return err
		}
		for day := lower; !day.After(today.AddDate(0, 0, cfg.Ahead)); day = day.AddDate(0, 0, 1) {
			p, err := s.createDay(ctx, tx, day)
			if err != nil {
				return err
			}
			res.Created = append(res.Created, p)
		}
		return nil
	})
	if err != nil {
		return PartitioningResult{}, fmt.Errorf("claimtx: enable partitioning: %w", err)
	}
	return res, nil
}

// CreatePartitionsAhead creates the missing day partitions from the
// horizon day through today + Ahead, and returns them; never a day older
// than the oldest partition (an empty one where an expired one was dropped
// would let its duplicates in). Each is created standalone and attached:
// CREATE TABLE … PARTITION OF would take ACCESS EXCLUSIVE and block claims.
func (s *Store) CreatePartitionsAhead(ctx context.Context, cfg RetentionConfig) ([]Partition, error) {
	return underRetentionLock(ctx, s, cfg, true, s.createAhead)
}

func (s *Store) requirePartitioned(ctx context.Context, q pg.Querier) error {
	kind, err := s.claimTableKind(ctx, q)
	if err == nil && kind == "r" {
		return ErrNotPartitioned
	}
	return err
}

// partitionsAt returns today, the horizon day (see days) and the
// partitions, read on conn.
func (s *Store) partitionsAt(ctx context.Context, conn *pgxpool.Conn, retention time.Duration) (today, horizonDay time.Time, parts []Partition, err error) {
	if today, horizonDay, err = s.days(ctx, conn, retention); err == nil {
		parts, err = s.partitions(ctx, conn)
	}
	return today, horizonDay, parts, err
}

func (s *Store) createAhead(ctx context.Context, conn *pgxpool.Conn, cfg RetentionConfig) ([]Partition, error) {
	today, horizonDay, parts, err := s.partitionsAt(ctx, conn, cfg.Retention)
	if err != nil {
		return nil, err
	}
	lower := horizonDay
	// Partition ranges never overlap, so the first by To is the oldest.
	if len(parts) > 0 && parts[0].From.After(lower) {
		lower = parts[0].From
	}
	var created []Partition
	for day := lower; !day.After(today.AddDate(0, 0, cfg.Ahead)); day = day.AddDate(0, 0, 1) {
		if slices.ContainsFunc(parts, func(p Partition) bool { return !day.Before(p.From) && day.Before(p.To) }) {
			continue // covered
		}
		p := s.dayPartition(day)
		if !cfg.DryRun {
			err := s.ddlTx(ctx, conn, cfg, func(tx pgx.Tx) error {
				_, err := s.createDay(ctx, tx, day)
				return err
			})
			if err != nil {
				return created, fmt.Errorf("claimtx: create partition %s: %w", p.Name, err)
			}
		}
		created = append(created, p)
	}
	return created, nil
}

// createDay creates the partition for one event day in tx.
func (s *Store) createDay(ctx context.Context, tx pgx.Tx, day time.Time) (Partition, error) {
	p := s.dayPartition(day)
	q := s.names.Qualified(p.Name)
	for _, stmt := range []string{
		s.names.Render("CREATE TABLE " + q + " (LIKE {schema}.{claims} INCLUDING ALL)"),
		s.names.Render("ALTER TABLE {schema}.{claims} ATTACH PARTITION " + q + " FOR VALUES FROM (" + dateLiteral(p.From) + ") TO (" + dateLiteral(p.To) + ")"),
	} {
		if _, err := tx.Exec(ctx, stmt); err != nil {
			return p, err
		}
	}
	return p, nil
}

// DropExpiredPartitions drops every partition whose event days all lie
// before the retention horizon (the legacy partition included), detached
// CONCURRENTLY so claims are never blocked, and returns them; an
// interrupted run is finished. Poison memos last poisoned more than
// Retention ago are then deleted.
func (s *Store) DropExpiredPartitions(ctx context.Context, cfg RetentionConfig) ([]Partition, error) {
	return underRetentionLock(ctx, s, cfg, true, s.dropExpired)
}

func (s *Store) dropExpired(ctx context.Context, conn *pgxpool.Conn, cfg RetentionConfig) ([]Partition, error) {
	_, horizonDay, parts, err := s.partitionsAt(ctx, conn, cfg.Retention)
	if err != nil {
		return nil, err
	}
	var dropped []Partition
	// drop drops p, detaching it first with mode unless mode is "".
	drop := func(p Partition, mode, what string) error {
		if !cfg.DryRun {
			if mode != "" {
				if err := execRenewed(ctx, conn, s.names.Render("ALTER TABLE {schema}.{claims} DETACH PARTITION "+s.names.Qualified(p.Name)+mode),
					"detach partition "+p.Name); err != nil {
					return err
				}
			}
			if err := execRenewed(ctx, conn, "DROP TABLE "+s.names.Qualified(p.Name), what+p.Name); err != nil {
				return err
			}
		}
		dropped = append(dropped, p)
		return nil
	}
	for _, p := range parts {
		if p.To.After(horizonDay) {
			continue
		}
		mode := " CONCURRENTLY"
		if p.DetachPending {
			mode = " FINALIZE"
		}
		if err := drop(p, mode, "drop partition "); err != nil {
			return dropped, err
		}
	}

	// Tables detached by an interrupted run, between detach and drop.
	rows, err := conn.Query(ctx, `SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = $1 AND c.relkind = 'r' AND NOT c.relispartition AND (c.relname = $2 OR c.relname ~ ('^' || $3 || '_p[0-9]{8}$'))`,
		s.cfg.Schema, s.legacyName(), s.cfg.ClaimsTable)
	var orphans []string
	if err == nil {
		orphans, err = pgx.CollectRows(rows, pgx.RowTo[string])
	}
	if err != nil {
		return dropped, fmt.Errorf("claimtx: find detached partitions: %w", err)
	}
	for _, name := range orphans {
		p := Partition{Name: name}
		if name != s.legacyName() {
			day, err := time.Parse(partitionDayLayout, name[len(s.cfg.ClaimsTable)+2:])
			if err != nil {
				continue
			}
			if p = s.dayPartition(day); p.To.After(horizonDay) {
				continue
			}
		}
		if err := drop(p, "", "drop detached partition "); err != nil {
			return dropped, err
		}
	}
	if !cfg.DryRun {
		horizon, err := s.horizon(ctx, conn, cfg.Retention)
		if err != nil {
			return dropped, err
		}
		if _, err := s.cleanupMemos(ctx, conn, horizon, cfg); err != nil {
			return dropped, err
		}
	}
	return dropped, nil
}

// ddlTx runs fn in a transaction whose lock waits are bounded by LockWait,
// retrying up to LockTries times when a lock wait times out: DDL queued
// for ACCESS EXCLUSIVE blocks every claim queued behind it, so it must
// give up quickly rather than wait out a long transaction.
func (s *Store) ddlTx(ctx context.Context, conn *pgxpool.Conn, cfg RetentionConfig, fn func(pgx.Tx) error) error {
	wait := pg.Millis(cfg.LockWait)
	for attempt := 1; ; attempt++ {
		err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			if err := leaseOf(ctx).renewTx(ctx, tx); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, "SELECT set_config('lock_timeout', $1, true)", wait); err != nil {
				return err
			}
			return fn(tx)
		})
		if err == nil || pg.Classify(err) != pg.ClaimWait || attempt >= cfg.LockTries {
			return err
		}
		if perr := pg.Sleep(ctx, time.Duration(attempt)*partitionLockRetryInterval); perr != nil {
			return errors.Join(err, perr)
		}
	}
}

// dateLiteral renders a day as a SQL date literal, safe to splice into DDL
// (Format yields only digits and dashes; partition bounds cannot be bind
// parameters).
func dateLiteral(day time.Time) string {
	return "'" + day.UTC().Format(time.DateOnly) + "'::date"
}
