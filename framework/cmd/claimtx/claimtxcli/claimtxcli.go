// Package claimtxcli is the claimtx operator CLI (framework/cmd/claimtx)
// as a package, so that a program of your own serves the whole of it,
// every command and the console, with the key and event-time extractors
// your consumers register:
//
//	func main() {
//		reg := framework.NewRegistry()
//		if err := reg.RegisterKey("tenant_idem", tenantIdem); err != nil { // as your consumer does
//			log.Fatal(err)
//		}
//		claimtxcli.Main(claimtxcli.Config{Extractors: reg})
//	}
//
// Every spec a command parses (dlq --key-spec, keys check --key-spec and
// --time-spec, explain --key-spec, the key of each console
// --consumer-config and of its paste-a-message page) is then resolved
// with that registry; the commands, flags, outputs and exit statuses are
// those of the claimtx binary, which is this package with Config{}.
//
// Broker adapters need no configuration here: the built-in kinds (amqp,
// kafka, nats) are linked by this package, and importing your own
// adapter's package, whose init calls brokers.Register, makes its kind
// known to every command (BROKER=mybus, kind: mybus). Dead letters are
// browsed (dlq, keys check --topic, the console's dead-letters page) on
// the built-in kinds; Config.BrowseAs says which of them serves a kind
// of yours.
package claimtxcli

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	// Every command that builds a broker from a configuration takes any
	// built-in kind: each adapter registers its own when linked.
	_ "github.com/claimtx/claimtx/brokers/amqp"
	_ "github.com/claimtx/claimtx/brokers/kafka"
	_ "github.com/claimtx/claimtx/brokers/nats"

	"github.com/claimtx/claimtx/brokers"
	"github.com/claimtx/claimtx/framework"
)

// Config configures the CLI.
type Config struct {
	// Extractors resolves every key and event-time spec the commands
	// parse: pass the registry your consumers resolve theirs with
	// (consumer.Config.Extractors). Defaults to the built-in extractors
	// only.
	Extractors *framework.Registry

	// BrowseAs maps a broker kind registered with brokers.Register to the
	// built-in configuration (amqp or kafka) its queues and topics are
	// read with where the commands browse without consuming: dlq list,
	// inspect and replay, keys check --topic, the console's dead letters.
	// An adapter that wraps a built-in one under a kind of its own
	// returns the wrapped configuration; a replay then republishes with
	// the built-in client, identity kept as always, and the console reads
	// the kind's replay horizon through it too. Another registered kind
	// cannot be browsed. Defaults to none.
	BrowseAs map[string]func(brokers.Config) (brokers.Config, error)
}

// browsed is b as the commands browse it: what BrowseAs says for its kind.
func (c Config) browsed(b brokers.Config) (brokers.Config, error) {
	as := c.BrowseAs[b.Kind]
	if as == nil {
		return b, nil
	}
	nb, err := as(b)
	if err != nil {
		return b, fmt.Errorf("broker kind %q: BrowseAs: %w", b.Kind, err)
	}
	return nb, nil
}

// Main runs the command line of the process (os.Args) and exits with its
// status. SIGINT and SIGTERM interrupt the command through its context: a
// cleanup stops after the current batch, a replay between two.
func Main(cfg Config) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := Run(ctx, cfg, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// Run executes one command line (args without the program's name, e.g.
// "dlq", "list", "--topic", "orders") with the process's environment, and
// returns the exit status: 0 on success, 1 when the operation failed, 2 on
// bad input. Cancelling ctx interrupts the command as a signal does.
func Run(ctx context.Context, cfg Config, args []string, stdout, stderr io.Writer) int {
	return runEnv(ctx, cfg, args, stdout, stderr, os.Getenv)
}
