// Package brokers builds the Watermill publisher and subscriber that claimtx
// consumes from and publishes to, chosen by configuration: RabbitMQ
// ("amqp"), Kafka ("kafka"), NATS JetStream ("nats"), an in-process
// channel for tests ("gochannel"), or an adapter of your own registered by
// name. Importing an adapter's package registers its kind, so a program
// links only the broker clients it uses. The guide is docs/configuration.md.
//
//	import _ "github.com/claimtx/claimtx/brokers/kafka" // links the "kafka" kind
//
//	cfg, err := brokers.LoadConfig("") // or LoadConfig("claimtx.yaml"), the environment over it
//	sub, err := brokers.NewSubscriber(cfg, logger)
//	pub, err := brokers.NewPublisher(cfg, logger)
//
// framework/consumer.LoadConfig reads a consumer file's "broker:" section
// the same way.
//
// # Configuration
//
// Config holds the kind and one section per built-in adapter, of which only
// the chosen kind's is used. Every field has a default, so the zero Config,
// an empty file and an empty environment give RabbitMQ at
// amqp://guest:guest@127.0.0.1:5672/. Unknown keys are errors; durations
// are Go durations ("250ms").
//
//	kind: kafka            # amqp | kafka | nats | gochannel | a registered name
//	amqp:
//	  url: amqp://app:secret@rabbit:5672/
//	  queue_type: quorum     # classic | quorum
//	kafka:
//	  brokers: [kafka-1:9092, kafka-2:9092]
//	  consumer_group: billing
//	  sasl: {mechanism: SCRAM-SHA-512, user: billing, password: secret}
//	  tls: {enabled: true, ca_file: /etc/ssl/kafka-ca.pem}
//	options:               # read by user-registered kinds only
//	  region: eu
//
// # Environment variables
//
// LoadConfig applies the environment over the defaults or the file (set
// but empty counts as unset), then validates. docs/configuration.md,
// "Brokers", lists every variable with its key and default (a test keeps
// the list complete), the _FILE variables for secrets, the strict NATS_
// prefix and the variables of a kind of your own (its name in upper case,
// then '_': MY_BUS_REGION sets Options["region"] of kind my-bus).
//
// # Errors and secrets
//
// Every configuration problem is a *framework.ConfigError whose Field is
// what the user set: the variable when the value came from one, otherwise
// the YAML path (docs/configuration.md). LoadConfig checks a built-in
// kind's section and any other kind's name only; Config.Validate,
// NewSubscriber and NewPublisher also refuse a kind that is not linked
// (ErrInvalidKind, naming the package to import) and run the kind's
// Factory.Validate. Printing a config (String, GoString) redacts every
// password, token and secret-named option (docs/security.md); marshalling
// one yourself does not.
//
// # Adapters
//
// Register links a kind of your own, which reads Config.Options (the
// Register example is a complete adapter; docs/adapters.md walks through
// brokers/nats). "gochannel" is Watermill's in-process GoChannel, for tests
// (see GoChannelConfig). Every adapter delivers at least once: what each
// broker does with unacked and nacked messages is in its adapter's
// documentation, the metadata they add in docs/configuration.md.
package brokers
