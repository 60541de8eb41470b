package brokers_test

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/brokers"
	"github.com/claimtx/claimtx/framework"
)

// clients are the module paths of each built-in adapter's client libraries.
var clients = map[string][]string{
	"amqp":  {"github.com/rabbitmq/amqp091-go"},
	"kafka": {"github.com/IBM/sarama", "github.com/twmb/franz-go"},
	"nats":  {"github.com/nats-io/nats.go"},
}

// TestOneBrokerLinksOneClient: a consumer built on framework/consumer (and
// framework/observe) links the client of the adapter it imports and no
// other; without an adapter, none.
func TestOneBrokerLinksOneClient(t *testing.T) {
	t.Parallel()
	base := []string{"github.com/claimtx/claimtx/brokers", "github.com/claimtx/claimtx/framework/consumer", "github.com/claimtx/claimtx/framework/observe"}
	for _, adapter := range []string{"", "amqp", "kafka", "nats"} {
		pkgs := base
		if adapter != "" {
			pkgs = append(append([]string(nil), base...), "github.com/claimtx/claimtx/brokers/"+adapter)
		}
		deps := listDeps(t, pkgs)
		for other, mods := range clients {
			for _, mod := range mods {
				linked := strings.Contains(deps, "\n"+mod+"\n") || strings.Contains(deps, "\n"+mod+"/")
				if other == adapter {
					require.True(t, linked, "brokers/%s without %s", adapter, mod)
				} else {
					require.False(t, linked, "with adapter %q, %s is linked", adapter, mod)
				}
			}
		}
	}
}

func listDeps(t *testing.T, pkgs []string) string {
	t.Helper()
	out, err := exec.Command("go", append([]string{"list", "-deps", "-f", "{{.ImportPath}}"}, pkgs...)...).Output() //nolint:gosec // the go tool on fixed package paths
	require.NoError(t, err)
	return "\n" + string(out)
}

// TestKindNotLinked: BROKER naming a shipped adapter that the program does
// not import says what to import. This test binary links amqp and kafka
// (config_test.go), not nats.
func TestKindNotLinked(t *testing.T) {
	t.Parallel()
	cfg := brokers.Config{Kind: "nats"}
	for _, err := range []error{cfg.Validate(), func() error { _, err := brokers.NewSubscriber(cfg, nil); return err }()} {
		var ce *framework.ConfigError
		require.ErrorAs(t, err, &ce)
		require.Equal(t, "kind", ce.Field)
		require.Contains(t, ce.Reason, `import _ "github.com/claimtx/claimtx/brokers/nats"`)
		require.ErrorIs(t, err, brokers.ErrInvalidKind)
	}
}
