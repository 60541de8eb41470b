package store

import (
	"context"
	"errors"
	"fmt"
	"regexp"
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
	// when no partition accepts the message's event day: the day is older than the retention horizon and
	// was dropped (the message is expired), or lies further in the future
	// than partitions were created (producer clock, or maintenance not
	// running). The message must not be applied without its claim.
	ErrNoPartition = claimsql.ErrNoPartition
	// ErrNotPartitioned is returned by partition maintenance on a plain
	// claim table (see EnablePartitioning).
	ErrNotPartitioned = errors.New("claimtx: the claim table is not partitioned (enable partitioning first)")
)

// Partition is one partition of the claim table.
type Partition struct {
	Name string
	// From is the first event day it holds; zero for the legacy partition
	// (the table's rows before the conversion, see EnablePartitioning),
	// which holds every day before To.
	From time.Time
	// To is the first event day it no longer holds (zero for a legacy
	// partition found detached but not dropped).
	To time.Time
	// DetachPending is true when a concurrent detach was interrupted; the
	// next DropExpiredPartitions finishes it.
	DetachPending bool
	// EstimatedRows is the planner's row count (0 until analysed).
	EstimatedRows int64
	// Bytes is the partition's total size, indexes included.
	Bytes int64
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
	// Created lists the day partitions created.
	Created []Partition
}

func (s *Store) legacyName() string { return s.cfg.ClaimsTable + "_legacy" }

func (s *Store) dayName(day time.Time) string {
	return s.cfg.ClaimsTable + "_p" + day.Format(partitionDayLayout)
}

var partitionBound = regexp.MustCompile(`^FOR VALUES FROM \((MINVALUE|'(\d{4}-\d{2}-\d{2})')\) TO \('(\d{4}-\d{2}-\d{2})'\)$`)

// Partitions lists the claim table's partitions, oldest first.
func (s *Store) Partitions(ctx context.Context) ([]Partition, error) {
	if err := s.requirePartitioned(ctx, s.pool); err != nil {
		return nil, err
	}
	return s.partitions(ctx, s.pool)
}

// beginner is what pgxpool.Pool and pgxpool.Conn have in common.
type beginner interface {
	BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error)
}

func (s *Store) partitions(ctx context.Context, db beginner) ([]Partition, error) {
	var parts []Partition
	err := pgx.BeginTxFunc(ctx, db, pgx.TxOptions{AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		// Bounds are read as text: make the date format independent of
		// the server's DateStyle.
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
		parts, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (Partition, error) {
			var p Partition
			var bound string
			if err := row.Scan(&p.Name, &bound, &p.DetachPending, &p.EstimatedRows, &p.Bytes); err != nil {
				return p, err
			}
			m := partitionBound.FindStringSubmatch(bound)
			if m == nil {
				return p, fmt.Errorf("partition %q has bound %q, which claimtx did not create", p.Name, bound)
			}
			var err error
			if m[2] != "" {
				if p.From, err = time.Parse(time.DateOnly, m[2]); err != nil {
					return p, err
				}
			}
			if p.To, err = time.Parse(time.DateOnly, m[3]); err != nil {
				return p, err
			}
			return p, nil
		})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("claimtx: list partitions: %w", err)
	}
	sort.Slice(parts, func(i, j int) bool { return parts[i].To.Before(parts[j].To) })
	return parts, nil
}

// days returns today and the horizon day (UTC) on the database clock. The
// horizon day is the day containing now minus retention: its partition,
// and every later one, may still hold claims inside the window.
func (s *Store) days(ctx context.Context, q pg.Querier, retention time.Duration) (today, horizonDay time.Time, err error) {
	err = q.QueryRow(ctx, `SELECT (now() AT TIME ZONE 'UTC')::date, ((now() - $1 * interval '1 microsecond') AT TIME ZONE 'UTC')::date`,
		retention.Microseconds()).Scan(&today, &horizonDay)
	if err != nil {
		return time.Time{}, time.Time{}, fmt.Errorf("claimtx: read database clock: %w", err)
	}
	return today.UTC(), horizonDay.UTC(), nil
}

// PreparePartitioning runs the online first half of EnablePartitioning on
// a plain claim table, for a rolling switch of consumers to event-time
// claims (ClaimRequest.EventTime):
//
//  1. it adds event_day date NOT NULL DEFAULT '-infinity' (metadata only,
//     no rewrite): rows claimed without an event time get -infinity,
//     rows claimed with one their day, so both kinds of consumer work
//     from here on and still deduplicate against each other on (consumer, message_key);
//  2. it builds, CONCURRENTLY (claims keep flowing), the unique indexes
//     the legacy partition will need: (consumer, message_key) and
//     (consumer, message_key, event_day).
//
// It is idempotent and resumable: an index left invalid by an interrupted
// build is dropped and rebuilt. Until EnablePartitioning runs, every claim
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

// underRetentionLock is the prologue every partition method shares: it
// validates cfg, applies its defaults and runs fn under the retention
// lease, so that no two maintenance runs interleave their DDL; with
// partitioned, only on a partitioned claim table. fn renews the lease in
// each of its transactions (ddlTx) and before each statement that runs
// outside one.
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
		if valid != nil {
			// Left invalid by an interrupted concurrent build.
			if err := leaseOf(ctx).renew(ctx); err != nil {
				return err
			}
			if _, err := conn.Exec(ctx, "DROP INDEX CONCURRENTLY IF EXISTS "+s.names.Qualified(idx.name)); err != nil {
				return fmt.Errorf("claimtx: prepare partitioning: drop invalid index %s: %w", idx.name, err)
			}
		}
		// CONCURRENTLY: no lock that blocks claims; it waits for running
		// transactions instead, so no lock_timeout here.
		if err := leaseOf(ctx).renew(ctx); err != nil {
			return err
		}
		if _, err := conn.Exec(ctx, "CREATE UNIQUE INDEX CONCURRENTLY "+pg.Ident(idx.name)+" ON "+s.names.Render("{schema}.{claims}")+" ("+idx.cols+")"); err != nil {
			return fmt.Errorf("claimtx: prepare partitioning: build index %s: %w", idx.name, err)
		}
	}
	return nil
}

// EnablePartitioning converts the claim table to partitioned mode, range
// partitioned by event_day, with primary key (consumer, message_key,
// event_day); consumers must then claim with ClaimRequest.EventTime (a
// claim without it fails: it supplies no event day). It is an explicit opt-in rather than a
// migration because it changes what every consumer must send, and because
// converting a large table is an operation to schedule.
//
// Existing claims are not copied: the old table becomes the legacy
// partition, holding every event day before a boundary (today + 2, UTC).
// It keeps its unique (consumer, message_key) index, so a redelivery of a
// message claimed before the conversion, whose old row carries no event
// day, still conflicts there. Later days get one partition each; a message
// claimed before the conversion cannot have an event day at or after the
// boundary (unless its producer's clock ran two days fast). The legacy
// partition is dropped like a day once the boundary falls behind the
// retention horizon. An empty table gets day partitions from the horizon
// on instead.
//
// Steps: PreparePartitioning (online); a CHECK (event_day < boundary)
// added NOT VALID and validated online, so attaching needs no scan; then
// one short transaction, under LockWait-bounded, retried locks: swap the
// primary key to the prepared index, rename the table to <table>_legacy,
// create the partitioned table under the old name, attach the legacy
// partition and create day partitions through today + Ahead. Grants,
// views and foreign keys that name the old table follow it to
// <table>_legacy: re-create them. It is idempotent: on a partitioned table
// it only creates missing days.
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
	if err := leaseOf(ctx).renew(ctx); err != nil {
		return res, err
	}
	if _, err := conn.Exec(ctx, s.names.Render("ALTER TABLE {schema}.{claims} VALIDATE CONSTRAINT "+boundName)); err != nil {
		return res, fmt.Errorf("claimtx: enable partitioning: claims with an event day on or after %s exist (event times written ahead of the clock); retry tomorrow: %w",
			boundary.Format(time.DateOnly), err)
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
			// No default: a claim without an event day (no
			// ClaimRequest.EventTime) must fail, not land in some partition.
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
		lower := horizonDay
		if empty {
			if _, err := tx.Exec(ctx, "DROP TABLE "+s.names.Qualified(s.legacyName())); err != nil {
				return err
			}
		} else {
			if _, err := tx.Exec(ctx, s.names.Render("ALTER TABLE {schema}.{claims} ATTACH PARTITION "+s.names.Qualified(s.legacyName())+
				" FOR VALUES FROM (MINVALUE) TO ("+dateLiteral(boundary)+")")); err != nil {
				return err
			}
			res.Legacy, res.Boundary, lower = true, boundary, boundary
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
// horizon day (or the oldest existing partition, whichever is later)
// through today + Ahead, and returns them. It never re-creates a day older
// than the oldest partition: that day may have been dropped as expired,
// and an empty partition in its place would let its duplicates in.
// Each day is created as a standalone table and then attached, which
// takes only a SHARE UPDATE EXCLUSIVE lock on the claim table: claims keep
// flowing (CREATE TABLE … PARTITION OF would take ACCESS EXCLUSIVE).
func (s *Store) CreatePartitionsAhead(ctx context.Context, cfg RetentionConfig) ([]Partition, error) {
	return underRetentionLock(ctx, s, cfg, true, s.createAhead)
}

func (s *Store) requirePartitioned(ctx context.Context, q pg.Querier) error {
	kind, err := s.claimTableKind(ctx, q)
	if err != nil {
		return err
	}
	if kind == "r" {
		return ErrNotPartitioned
	}
	return nil
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
	covered := func(day time.Time) bool {
		for _, p := range parts {
			if !day.Before(p.From) && day.Before(p.To) {
				return true
			}
		}
		return false
	}
	lower := horizonDay
	// Partition ranges never overlap, so the first by To is the oldest.
	if len(parts) > 0 && parts[0].From.After(lower) {
		lower = parts[0].From
	}
	var created []Partition
	for day := lower; !day.After(today.AddDate(0, 0, cfg.Ahead)); day = day.AddDate(0, 0, 1) {
		if covered(day) {
			continue
		}
		if cfg.DryRun {
			created = append(created, Partition{Name: s.dayName(day), From: day, To: day.AddDate(0, 0, 1)})
			continue
		}
		var p Partition
		err := s.ddlTx(ctx, conn, cfg, func(tx pgx.Tx) error {
			var err error
			p, err = s.createDay(ctx, tx, day)
			return err
		})
		if err != nil {
			return created, fmt.Errorf("claimtx: create partition %s: %w", s.dayName(day), err)
		}
		created = append(created, p)
	}
	return created, nil
}

// createDay creates the partition for one event day in tx.
func (s *Store) createDay(ctx context.Context, tx pgx.Tx, day time.Time) (Partition, error) {
	p := Partition{Name: s.dayName(day), From: day, To: day.AddDate(0, 0, 1)}
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
// before the retention horizon (the legacy partition included, once its
// boundary is behind the horizon) and returns them. Each is detached
// CONCURRENTLY (claims on other days are never blocked) and then dropped:
// O(1) whatever its size, no dead rows, no vacuum. An interrupted detach is
// finished, and a partition detached but not yet dropped is dropped.
// Poison memos (middleware.Claim.PoisonMemo), which are not partitioned,
// are then deleted by time: those last poisoned more than Retention ago.
func (s *Store) DropExpiredPartitions(ctx context.Context, cfg RetentionConfig) ([]Partition, error) {
	return underRetentionLock(ctx, s, cfg, true, s.dropExpired)
}

func (s *Store) dropExpired(ctx context.Context, conn *pgxpool.Conn, cfg RetentionConfig) ([]Partition, error) {
	_, horizonDay, parts, err := s.partitionsAt(ctx, conn, cfg.Retention)
	if err != nil {
		return nil, err
	}
	var dropped []Partition
	for _, p := range parts {
		if p.To.After(horizonDay) {
			continue
		}
		if !cfg.DryRun {
			mode := " CONCURRENTLY"
			if p.DetachPending {
				mode = " FINALIZE"
			}
			if err := leaseOf(ctx).renew(ctx); err != nil {
				return dropped, err
			}
			if _, err := conn.Exec(ctx, s.names.Render("ALTER TABLE {schema}.{claims} DETACH PARTITION "+s.names.Qualified(p.Name)+mode)); err != nil {
				return dropped, fmt.Errorf("claimtx: detach partition %s: %w", p.Name, err)
			}
			if err := leaseOf(ctx).renew(ctx); err != nil {
				return dropped, err
			}
			if _, err := conn.Exec(ctx, "DROP TABLE "+s.names.Qualified(p.Name)); err != nil {
				return dropped, fmt.Errorf("claimtx: drop partition %s: %w", p.Name, err)
			}
		}
		dropped = append(dropped, p)
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
			p.From, p.To = day, day.AddDate(0, 0, 1)
			if p.To.After(horizonDay) {
				continue
			}
		}
		if !cfg.DryRun {
			if err := leaseOf(ctx).renew(ctx); err != nil {
				return dropped, err
			}
			if _, err := conn.Exec(ctx, "DROP TABLE "+s.names.Qualified(name)); err != nil {
				return dropped, fmt.Errorf("claimtx: drop detached partition %s: %w", name, err)
			}
		}
		dropped = append(dropped, p)
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
// retrying up to LockTries times when a lock wait times out. A DDL
// statement queued for ACCESS EXCLUSIVE blocks every claim queued behind
// it, so it must give up quickly rather than wait out a long transaction.
func (s *Store) ddlTx(ctx context.Context, conn *pgxpool.Conn, cfg RetentionConfig, fn func(pgx.Tx) error) error {
	wait := pg.Millis(cfg.LockWait)
	var err error
	for attempt := 1; ; attempt++ {
		err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
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

// dateLiteral renders a day as a SQL date literal. Only digits and dashes
// come out of Format, so it is safe to splice into DDL (bounds of
// partitions cannot be bind parameters).
func dateLiteral(day time.Time) string {
	return "'" + day.UTC().Format(time.DateOnly) + "'::date"
}
