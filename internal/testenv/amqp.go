package testenv

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"
)

// QueueDepth returns the ready messages of an AMQP queue, 0 if it does not
// exist, read on a channel of its own so a missing queue closes nothing
// the caller uses.
func QueueDepth(t testing.TB, conn *amqp.Connection, queue string) int {
	t.Helper()
	ch, err := conn.Channel()
	require.NoError(t, err)
	defer func() { _ = ch.Close() }()
	q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	var aerr *amqp.Error
	if errors.As(err, &aerr) && aerr.Code == amqp.NotFound {
		return 0
	}
	require.NoError(t, err)
	return q.Messages
}

// CloseAMQPConnections makes RabbitMQ close the connections whose
// connection_name (brokers.AMQPConfig.ConnectionName, the amqp091
// "connection_name" property) is one of names, and only those, with
// rabbitmqctl: the server sends them CONNECTION_FORCED, as on a broker
// restart, and everyone else's connections stay. It returns how many it
// closed.
func CloseAMQPConnections(ctx context.Context, reason string, names ...string) (int, error) {
	out, err := exec.CommandContext(ctx, "rabbitmqctl", "list_connections", "--quiet", "--no-table-headers", "pid", "client_properties").CombinedOutput()
	if err != nil {
		return 0, fmt.Errorf("rabbitmqctl list_connections: %w: %s", err, out)
	}
	var pids []string
	for _, line := range strings.Split(string(out), "\n") {
		pid, props, ok := strings.Cut(line, "\t")
		if ok && slices.ContainsFunc(names, func(n string) bool { return strings.Contains(props, `{"connection_name","`+n+`"}`) }) {
			pids = append(pids, pid)
		}
	}
	// At once: each rabbitmqctl takes seconds to start, and the
	// connections should drop together, as on a broker restart.
	errs := make([]error, len(pids))
	var wg sync.WaitGroup
	for i, pid := range pids {
		wg.Go(func() {
			// pid is a connection pid as rabbitmqctl itself printed it.
			if out, err := exec.CommandContext(ctx, "rabbitmqctl", "close_connection", pid, reason).CombinedOutput(); err != nil { //nolint:gosec // see above
				errs[i] = fmt.Errorf("rabbitmqctl close_connection: %w: %s", err, out)
			}
		})
	}
	wg.Wait()
	return len(pids), errors.Join(errs...)
}
