package console

import (
	"cmp"
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/claimtx/claimtx/brokers"
	"github.com/claimtx/claimtx/internal/kafkarecord"
)

// positionRow is a stored Kafka position, with the end offset and lag
// when the consumer is configured with its Kafka broker.
type positionRow struct {
	Consumer, Topic   string
	Partition         int32
	SettledBelow      int64
	UpdatedAt         time.Time
	End, Lag, LagNote string
}

// positions reads the stored Kafka positions (one row per partition) and
// the end offsets of the configured consumers'. A schema from before
// migration 7 has none.
func (c *Console) positions(ctx context.Context) ([]positionRow, error) {
	q := c.names.Render(`SELECT consumer, topic, partition, settled_below, updated_at
FROM {schema}.kafka_positions ORDER BY consumer, topic, partition LIMIT 1000`)
	var rows []positionRow
	err := c.readOnly(ctx, func(tx pgx.Tx) error {
		rs, err := tx.Query(ctx, q)
		if err != nil {
			return err
		}
		rows, err = pgx.CollectRows(rs, pgx.RowToStructByNameLax[positionRow])
		return err
	})
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == "42P01" { // undefined_table
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	ends := map[string]map[int32]int64{} // consumer -> partition -> end
	notes := map[string]string{}
	for i := range rows {
		p := &rows[i]
		cs := c.consumer(p.Consumer)
		if cs == nil || cs.Topic != p.Topic || cs.Broker.Kind != brokers.KindKafka {
			p.End, p.Lag, p.LagNote = "—", "—", "start the console with this consumer's --consumer-config (Kafka) for the end offsets"
			continue
		}
		e, seen := ends[cs.Name]
		if !seen {
			e, notes[cs.Name] = c.endOffsets(ctx, cs)
			ends[cs.Name] = e
		}
		end, ok := e[p.Partition]
		if !ok {
			p.End, p.Lag, p.LagNote = "?", "?", cmp.Or(notes[cs.Name], "no such partition")
			continue
		}
		p.End, p.Lag = strconv.FormatInt(end, 10), strconv.FormatInt(max(end-p.SettledBelow, 0), 10)
		p.LagNote = "records past the stored position: not settled yet"
	}
	return rows, nil
}

// endOffsets asks cs's Kafka broker for the end offsets of its topic.
func (c *Console) endOffsets(ctx context.Context, cs *Consumer) (map[int32]int64, string) {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.QueryTimeout)
	defer cancel()
	sub, err := c.probe(cs.Broker)
	if err != nil {
		return nil, c.errText(err)
	}
	defer func() { _ = sub.Close() }()
	endOffsets, ok := kafkarecord.EndOffsets(sub)
	if !ok {
		return nil, "this broker cannot tell its end offsets"
	}
	ends, err := endOffsets(ctx, cs.Topic)
	if err != nil {
		return nil, c.errText(err)
	}
	return ends, ""
}
