// Package consumer is claimtx's composition root: from one Config it builds
// the broker subscriber and publisher, the Postgres store (migrated), and a
// Watermill router running
//
//	Recoverer -> Poison -> Retry -> [ExpiryGuard] -> Claim -> your handler
//
// so that an application is a handler and a configuration (the broker is
// Config.Broker, never code). For another layout, use brokers, store and
// middleware directly: this package only wires them.
//
//	cfg, err := consumer.LoadConfig(os.Getenv("CONFIG_FILE")) // "" reads the environment only
//	if err != nil { return err }
//	c, err := consumer.New(ctx, cfg, func(ctx context.Context, tx pgx.Tx, msg *message.Message) error {
//		_, err := tx.Exec(ctx, "INSERT INTO balances … ON CONFLICT (customer_id) DO UPDATE …", …)
//		return err // commits with the claim, or rolls back with it
//	})
//	if err != nil { return err } // a *framework.ConfigError names the field
//	defer c.Close()
//	return c.Run(ctx) // until ctx ends, then drains (Config.DrainTimeout)
//
// A message is never acked without its effect committed (or found committed
// before) or a copy in the poison topic, and never redelivered forever. See
// docs/configuration.md, docs/reliability.md, docs/batch.md and
// examples/loyalty.
package consumer
