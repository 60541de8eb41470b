package console_test

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/claimtx/claimtx/brokers"
	"github.com/claimtx/claimtx/brokers/kafka/kafkatest"
	"github.com/claimtx/claimtx/framework/cmd/claimtx/internal/console"
)

// positionRow returns the overview's <tr> of a stored position.
func positionRow(t *testing.T, body, key string) []string {
	t.Helper()
	start := strings.Index(body, `<tr data-position="`+key+`">`)
	require.GreaterOrEqual(t, start, 0, "no position row %s in\n%s", key, body)
	end := strings.Index(body[start:], "</tr>")
	return cells(body[start : start+end])
}

// TestOverviewKafkaPositions: the overview lists the stored Kafka
// positions, with the end offset and lag of a consumer configured with its
// Kafka broker.
func TestOverviewKafkaPositions(t *testing.T) {
	t.Parallel()
	br, err := kafkatest.Start(t.Context(), kafkatest.Options{Addr: "127.0.0.1:0"})
	require.NoError(t, err)
	t.Cleanup(func() { _ = br.Close() })
	cl, err := kgo.NewClient(kgo.SeedBrokers(br.Addrs()...))
	require.NoError(t, err)
	defer cl.Close()
	_, err = kadm.NewClient(cl).CreateTopic(context.Background(), 1, 1, nil, "orders")
	require.NoError(t, err)
	for range 9 {
		require.NoError(t, cl.ProduceSync(context.Background(), &kgo.Record{Topic: "orders", Value: []byte("x")}).FirstErr())
	}
	var kafka brokers.Config
	kafka.Kind, kafka.Kafka.Brokers = brokers.KindKafka, br.Addrs()
	e := newEnv(t, func(c *console.Config) {
		c.Consumers = []console.Consumer{{Name: "loyalty", Topic: "orders", Broker: kafka}}
	})
	body := e.ok("/")
	require.NotContains(t, body, `<table id="positions">`, "no positions stored: no table")

	e.exec(`INSERT INTO ` + pgx.Identifier{e.schema, "kafka_positions"}.Sanitize() + ` (consumer, topic, partition, settled_below)
VALUES ('loyalty', 'orders', 0, 6), ('billing', 'invoices', 2, 40)`)
	body = e.ok("/")
	require.Contains(t, body, `<table id="positions">`)
	require.Equal(t, []string{"loyalty", "orders", "0", "6", "9", "3"}, positionRow(t, body, "loyalty/orders/0")[:6])
	require.Equal(t, []string{"billing", "invoices", "2", "40", "—", "—"}, positionRow(t, body, "billing/invoices/2")[:6])
}
