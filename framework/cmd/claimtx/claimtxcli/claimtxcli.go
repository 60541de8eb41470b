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
// Every key and event-time spec a command parses (dlq, keys check,
// explain, the console's consumers and paste-a-message) is then resolved
// with that registry; everything else is the claimtx binary, which is this
// package with Config{}.
//
// The built-in broker kinds are linked by this package; importing your own
// adapter (its init calls brokers.Register) makes its kind known to every
// command. Dead letters are browsed on the built-in kinds only:
// Config.BrowseAs says which of them serves a kind of yours.
package claimtxcli

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	// Each adapter registers its kind when linked.
	_ "github.com/claimtx/claimtx/brokers/amqp"
	_ "github.com/claimtx/claimtx/brokers/kafka"
	_ "github.com/claimtx/claimtx/brokers/nats"

	"github.com/claimtx/claimtx/brokers"
	"github.com/claimtx/claimtx/framework"
)

// Config configures the CLI.
type Config struct {
	// Extractors resolves every key and event-time spec the commands
	// parse: the registry of your consumers (consumer.Config.Extractors).
	// Defaults to the built-in extractors only.
	Extractors *framework.Registry

	// BrowseAs maps a kind registered with brokers.Register to the built-in
	// configuration its queues and topics are browsed with (dlq, keys check
	// --topic, the console's dead letters and replay horizon): an adapter
	// wrapping a built-in one returns the wrapped configuration. Other
	// registered kinds cannot be browsed.
	BrowseAs map[string]func(brokers.Config) (brokers.Config, error)
}

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
