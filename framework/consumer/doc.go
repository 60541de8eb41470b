// Package consumer is claimtx's composition root: from one Config it builds
// the broker subscriber and publisher, the Postgres store (migrated), and a
// Watermill router running
//
//	Recoverer -> Poison -> Retry -> [ExpiryGuard] -> Claim -> your handler
//
// so that an application is a handler and a configuration. Switching
// RabbitMQ and Kafka is a change of Config.Broker (Kind; brokers.LoadConfig("")
// reads it from BROKER=amqp|kafka), never of code. Use the parts directly
// (brokers, store, middleware) when you need a different router layout;
// this package only wires them.
//
// # A consumer
//
//	bcfg, err := brokers.LoadConfig("")
//	if err != nil { return err }
//	c, err := consumer.New(ctx, consumer.Config{
//		Name:        "loyalty", // stored with every claim
//		Topic:       "order-completed",
//		Key:         "template:order-completed:{payload.order_id}",
//		DatabaseURL: os.Getenv("DATABASE_URL"),
//		Broker:      bcfg,
//	}, func(ctx context.Context, tx pgx.Tx, msg *message.Message) error {
//		_, err := tx.Exec(ctx, "INSERT INTO balances … ON CONFLICT (customer_id) DO UPDATE …", …)
//		return err // commits with the claim, or rolls back with it
//	})
//	if err != nil { return err } // a *framework.ConfigError names the field
//	defer c.Close()
//	return c.Run(ctx) // until ctx ends, then drains (Config.DrainTimeout)
//
// New validates the Config, connects to PostgreSQL (waiting up to
// Config.StartupTimeout for it; a failure is a *StartupError), migrates
// claimtx's schema, builds the broker clients and the router, and returns;
// Run consumes. Consumer.Running is closed once the subscription exists,
// Health is the readiness check (an http.Handler) and Close releases
// everything.
// examples/loyalty is a complete service built this way.
//
// # One configuration file
//
// LoadConfig reads all of a Config that is not code from one YAML file
// and the environment over it: the broker section (brokers.LoadConfig),
// Key and EventTime specs, the claim options, HandlerRetries and the
// timeouts, Retention. Unknown keys and bad values are
// *framework.ConfigErrors naming the YAML path or the variable, and so are
// New's errors about a field it set. Secrets may come from files
// (DATABASE_URL_FILE, AMQP_URL_FILE, KAFKA_SASL_PASSWORD_FILE), and
// Config.String redacts them:
//
//	cfg, err := consumer.LoadConfig(os.Getenv("CONFIG_FILE")) // "" reads the environment only
//	if err != nil { return err }
//	cfg.Logger = logger
//	c, err := consumer.New(ctx, cfg, handler)
//
// examples/loyalty/config.example.yaml documents every key.
//
// # The claim
//
// Config.Claim holds the claim middleware's options (middleware.Claim):
// the key in code (Claim.Key, instead of the Key spec), the key policy, the
// mode (middleware.ModeNaturalKey), the outbox topic, the isolation level,
// the commit's durability (SynchronousCommit, with a warning while the
// server lacks the synchronous standby it needs), MaxClaimWait, the attempts and backoff of transient failures, the event
// time, fingerprints and an OnRetry hook. The consumer sets the claim's
// Store, Consumer, Logger and OnOutcome itself, from Pool or DatabaseURL
// and Store, Name, Logger and OnOutcome: New refuses a Claim with any of
// them set, naming the Config field to use.
//
// # Failures
//
// One policy, in both consumers: a message is never acked without its
// effect committed (or found committed before: a duplicate) or a copy in
// the poison topic (Config.PoisonTopic, default Topic + ".poison", with the
// reason under middleware.PoisonReasonKey), and never redelivered forever.
//
//   - Permanent errors (framework.Permanent, an unkeyable or undecodable
//     message) are poisoned at once.
//   - Handler errors, panics and Config.HandlerTimeout are retried in
//     process Config.HandlerRetries times with backoff, then poisoned.
//   - Transient database failures (serialization, deadlock, claim wait,
//     lost connection) are retried by the claim, a fresh transaction each
//     time, up to Claim.MaxAttempts, then nacked: a database outage does
//     not dead-letter the messages in flight.
//   - A shutdown (the context given to Run ends, or Close) takes no new
//     message and gives the ones in flight Config.DrainTimeout to commit
//     and be acked; the rest is cancelled, rolled back and nacked, never
//     poisoned.
//   - With Claim.PoisonMemo, a poisoned message is remembered under its
//     (consumer, key), recorded once its copy is published, and its later
//     copies are poisoned without running the handler until `claimtx
//     unpoison` clears the memo (see middleware.Claim.PoisonMemo).
//
// Config.OnOutcome and the metrics (Config.Registerer) see one outcome per
// message, once it is acked or nacked: Applied, Duplicate, Poisoned,
// Expired or Failed. docs/reliability.md has the policy in full.
//
// # Batches
//
// NewBatch builds, from the same Config, a Consumer that applies up to
// BatchOptions.MaxSize messages in one claim transaction each, with a set
// handler (middleware.SetHandlerFunc) called once for the newly claimed
// messages of a batch, and the same failure and shutdown policy. Give the
// broker a window to hold that many unacked messages (Broker.AMQP.Window,
// Broker.Kafka.Window). docs/batch.md explains it.
package consumer
