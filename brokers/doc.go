// Package brokers builds the Watermill publisher and subscriber that claimtx
// consumes from and publishes to, chosen by configuration: RabbitMQ
// ("amqp"), Kafka ("kafka"), NATS JetStream ("nats"), an in-process
// channel for tests ("gochannel"), or an adapter of your own registered by
// name. Each adapter is a package that registers its kind when imported,
// so a program links the broker clients of the adapters it imports and no
// others; switching between them is then a configuration change.
//
// # Quick start
//
//	import _ "github.com/claimtx/claimtx/brokers/kafka" // links the "kafka" kind
//
//	cfg, err := brokers.LoadConfig("") // BROKER=kafka KAFKA_BROKERS=...
//	if err != nil {
//		return err // a *framework.ConfigError naming the variable
//	}
//	sub, err := brokers.NewSubscriber(cfg, logger)
//	...
//	pub, err := brokers.NewPublisher(cfg, logger)
//
// Or from a file, with the environment overriding it:
//
//	cfg, err := brokers.LoadConfig("claimtx.yaml")
//
// framework/consumer.LoadConfig reads the "broker:" section of a
// consumer's file the same way.
//
// # Configuration
//
// Config holds the kind and one section per built-in adapter; only the
// section of the chosen kind is used and validated. Every field has a
// default (the "Defaults to" line of each field of Config, GoChannelConfig,
// AMQPConfig, KafkaConfig and NATSConfig), so the zero Config, an
// empty file and an empty environment all give a working local setup:
// RabbitMQ at amqp://guest:guest@127.0.0.1:5672/. LoadConfig writes the
// defaults out, so the Config it returns shows every effective value.
//
//	kind: kafka            # amqp | kafka | nats | gochannel | a registered name
//	amqp:
//	  url: amqp://app:secret@rabbit:5672/
//	  concurrency: 8
//	  nack_delay: 1s
//	  queue_type: quorum     # classic | quorum
//	  delivery_limit: 50
//	kafka:
//	  brokers: [kafka-1:9092, kafka-2:9092]
//	  consumer_group: billing
//	  session_timeout: 10s
//	  sasl: {mechanism: SCRAM-SHA-512, user: billing, password: secret}
//	  tls: {enabled: true, ca_file: /etc/ssl/kafka-ca.pem}
//	nats:
//	  url: nats://nats-1:4222,nats://nats-2:4222
//	  durable: billing
//	  ack_wait: 30s
//	gochannel:
//	  name: tests
//	options:               # read by user-registered kinds only
//	  region: eu
//
// Unknown keys are errors, so a misspelt key does not silently become a
// default. Durations are Go durations ("250ms", "10s").
//
// # Environment variables
//
// LoadConfig starts from the defaults, or from the file it is given, then
// applies these variables (set but empty counts as unset) and validate:
//
//	BROKER                   kind                           (default amqp)
//	AMQP_URL                 amqp.url                       (default amqp://guest:guest@127.0.0.1:5672/)
//	CONCURRENCY              amqp.concurrency               (default 4; AMQP only, see below)
//	AMQP_PREFETCH            amqp.prefetch                  (default 1)
//	AMQP_WINDOW              amqp.window                    (default 0: one message per subscription)
//	AMQP_NACK_DELAY          amqp.nack_delay                (default 1s)
//	AMQP_DIAL_TIMEOUT        amqp.dial_timeout              (default 30s)
//	AMQP_QUEUE_TYPE          amqp.queue_type                (classic or quorum; default classic)
//	AMQP_DELIVERY_LIMIT      amqp.delivery_limit            (quorum only; default none)
//	KAFKA_BROKERS            kafka.brokers, comma separated (default 127.0.0.1:9092)
//	KAFKA_CONSUMER_GROUP     kafka.consumer_group           (no default; required to subscribe)
//	KAFKA_INITIAL_OFFSET     kafka.initial_offset           (default oldest)
//	KAFKA_VERSION            kafka.version                  (default 3.6.0)
//	KAFKA_CLIENT_ID          kafka.client_id                (default claimtx)
//	KAFKA_SESSION_TIMEOUT    kafka.session_timeout          (default 10s)
//	KAFKA_REBALANCE_TIMEOUT  kafka.rebalance_timeout        (default 60s)
//	KAFKA_NACK_DELAY         kafka.nack_delay               (default 1s)
//	KAFKA_WINDOW             kafka.window                   (default 0: one message per partition)
//	KAFKA_DIAL_TIMEOUT       kafka.dial_timeout             (default 30s)
//	KAFKA_SASL_MECHANISM     kafka.sasl.mechanism           (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512)
//	KAFKA_SASL_USER          kafka.sasl.user
//	KAFKA_SASL_PASSWORD      kafka.sasl.password
//	KAFKA_TLS                kafka.tls.enabled              (true/false)
//	KAFKA_TLS_CA_FILE        kafka.tls.ca_file
//	KAFKA_TLS_CERT_FILE      kafka.tls.cert_file
//	KAFKA_TLS_KEY_FILE       kafka.tls.key_file
//	NATS_URL                 nats.url                       (default nats://127.0.0.1:4222)
//	NATS_USER                nats.user
//	NATS_PASSWORD            nats.password
//	NATS_TOKEN               nats.token
//	NATS_CREDS_FILE          nats.creds_file
//	NATS_DURABLE             nats.durable                   (no default; required to subscribe)
//	NATS_SUBJECT_PREFIX      nats.subject_prefix
//	NATS_ACK_WAIT            nats.ack_wait                  (default 30s)
//	NATS_MAX_DELIVER         nats.max_deliver               (default -1: unlimited)
//	NATS_MAX_ACK_PENDING     nats.max_ack_pending           (default 256)
//	NATS_NACK_DELAY          nats.nack_delay                (default 1s)
//	NATS_CONCURRENCY         nats.concurrency               (default 4)
//	NATS_STREAMS             nats.streams                   (create or require; default create)
//	NATS_DIAL_TIMEOUT        nats.dial_timeout              (default 30s)
//
// With BROKER=nats (or kind: nats), any other variable that starts with
// NATS_ is an error, so a misspelt one (NATS_ACKWAIT) is not ignored.
//
// A secret can also come from a file: AMQP_URL_FILE, NATS_URL_FILE,
// NATS_PASSWORD_FILE, NATS_TOKEN_FILE and KAFKA_SASL_PASSWORD_FILE name a
// file holding the value of the variable without _FILE (a Docker or Kubernetes secret mounted as a file;
// surrounding white space, such as the trailing newline, is dropped).
// Setting both a variable and its _FILE variable is an error; an error
// about a value read from a file names the _FILE variable.
//
// CONCURRENCY is the number of messages one subscription processes at once
// on RabbitMQ. Kafka has no such knob: watermill-kafka keeps one message in
// flight per partition, so a consumer's concurrency is the number of
// partitions it owns (unless kafka.window is set).
//
// A kind that is not built in is configured from the environment through
// its prefix: the kind in upper case with '.' and '-' as '_', then '_'.
// Every variable that starts with it sets Options[option], the rest of its
// name in lower case, over the file's options: (set but empty counts as
// unset). With kind my-bus.v2, MY_BUS_V2_REGION sets Options["region"].
// Which options exist, and whether an unknown one is an error, is the
// kind's Factory's business (refusing unknown ones means a misspelt
// variable is not ignored); pick a kind name whose prefix no other
// program's variables use.
//
// # Errors
//
// Every configuration problem is a *framework.ConfigError (package
// github.com/claimtx/claimtx/framework, the one configuration error type of
// claimtx) whose Field is what the user set: the environment variable when
// the value came from one (and, with LoadConfig(""), the variable to set for
// a required field left empty), otherwise the field's YAML path (also for
// values the YAML decoder refuses):
//
//	claimtx: config field "KAFKA_BROKERS": entry 0 ("kafka") is not host:port
//	claimtx: config field "kafka.brokers": entry 0 ("kafka") is not host:port
//
// There is no default Kafka consumer group: a shared one would make two
// services on one topic split its partitions. NewSubscriber refuses an
// empty kafka.consumer_group; framework/consumer sets it to the consumer's
// Name.
//
// Validate never panics, and NewSubscriber/NewPublisher validate first, so a
// bad config fails at start-up with that error. Adapter construction errors
// are wrapped with %w and keep their cause (for example
// *brokers/amqp.DialError).
//
// LoadConfig checks the amqp, kafka and gochannel sections, whether or
// not their adapter is linked; any other kind only for being a well-formed
// name, because the program may still fill in its options. Config.Validate,
// NewSubscriber and NewPublisher check the rest: they refuse a kind that
// is not linked with a *framework.ConfigError (Field "kind", or BROKER)
// that matches ErrInvalidKind and lists the linked kinds (for "amqp",
// "kafka" and "nats" it names the package to import instead), and run the
// kind's own Factory.Validate. So a misspelt BROKER ("kafak") passes
// LoadConfig("") and fails at Config.Validate, which a program calls
// before it connects anywhere (framework/consumer does), or when the broker
// is built; one that cannot be a kind name ("Kafka") fails at once.
//
// A registered kind names its settings "options.<option>" in the
// *framework.ConfigError its Factory returns (from Validate or from
// NewSubscriber/NewPublisher); package brokers renames the Field to the
// variable (NATS_ACK_WAIT) when the environment set the value or, with
// LoadConfig(""), for a required option left unset.
//
// # Secrets
//
// Config.String (and %v, %+v, %#v of Config, AMQPConfig, KafkaConfig and
// KafkaSASLConfig) redacts the AMQP URL's password and the Kafka SASL
// password, so logging the effective configuration at start-up is safe.
// Keep secrets out of configuration files and the environment where you
// can: AMQP_URL_FILE and KAFKA_SASL_PASSWORD_FILE read them from files, and
// neither the value nor the file's content appears in an error.
// Validation errors never quote a URL that does not parse (Go's url.Error
// would print it whole, password included). In Config.Options it redacts
// the value of every option whose name contains "pass", "secret" or
// "token" (any case) and the password of every URL: a registered kind
// names its secret options to match. The config is not redacted when you
// marshal it yourself (YAML, JSON).
//
// # Adapters of your own
//
// Register a Factory under a name from your adapter package's init
// function (like database/sql.Register; names are [a-z0-9_.-], up to 63
// characters; Register panics on a malformed name, an incomplete Factory
// or a name that is taken); BROKER=name or kind: name then selects it, and
// it reads its settings from Config.Options. The Register example shows a
// complete adapter; docs/adapters.md walks through brokers/nats, a real one.
//
// # The gochannel kind
//
// "gochannel" is Watermill's in-process GoChannel, for tests and examples.
// All publishers and subscribers built from equal GoChannelConfig values
// share one process-wide GoChannel, so a publisher and a subscriber built
// from the same Config talk to each other; a different Name is a separate
// broker. The shared instance lives while at least one publisher or
// subscriber built on it is open and is closed (dropping persisted messages)
// with the last one. Closing a subscriber ends only its own subscriptions.
// GoChannel re-sends a nacked message at once, with no delay: fine for tests.
//
// # Delivery guarantees, per adapter
//
// Both real adapters deliver at least once; claimtx's claim makes the
// handler's effect happen at most once. What each broker does with an
// unacked or nacked message, and why, is in the brokers/amqp and
// brokers/kafka documentation. brokers/kafka/kafkatest is an in-process
// Kafka-protocol broker for development and CI.
//
// # Metadata
//
// Headers arrive as metadata of the same name; the delivery metadata each
// adapter adds (amqp_*, kafka_*, nats_*) is listed in docs/configuration.md
// ("Delivery metadata"). None is published again and none makes a good
// claim key: they change when a message is republished.
package brokers
