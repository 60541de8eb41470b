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
// LoadConfig applies these over the defaults or the file (set but empty
// counts as unset), then validates:
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
// With BROKER=nats, any other variable that starts with NATS_ is an error,
// so a misspelt one (NATS_ACKWAIT) is not ignored. AMQP_URL_FILE,
// NATS_URL_FILE, NATS_PASSWORD_FILE, NATS_TOKEN_FILE and
// KAFKA_SASL_PASSWORD_FILE name a file holding the secret (surrounding
// white space dropped); setting both a variable and its _FILE is an error.
// CONCURRENCY is per RabbitMQ subscription; on Kafka a consumer's
// concurrency is the partitions it owns (times kafka.window).
//
// A kind that is not built in is configured through its prefix, the kind
// in upper case with '.' and '-' as '_', then '_': with kind my-bus.v2,
// MY_BUS_V2_REGION sets Options["region"]. Which options exist is up to
// the kind's Factory.
//
// # Errors
//
// Every configuration problem is a *framework.ConfigError whose Field is
// what the user set: the variable when the value came from one (a
// registered kind's "options.<option>" too; with LoadConfig(""), also the
// one to set for a required field left empty), otherwise the YAML path:
//
//	claimtx: config field "KAFKA_BROKERS": entry 0 ("kafka") is not host:port
//	claimtx: config field "kafka.brokers": entry 0 ("kafka") is not host:port
//
// LoadConfig checks a built-in kind's section and any other kind's name
// only, as the program may still fill in its options. Config.Validate,
// NewSubscriber and NewPublisher also refuse a kind that is not linked
// (matching ErrInvalidKind; for "amqp", "kafka" and "nats" naming the
// package to import) and run the kind's Factory.Validate. Validate never
// panics.
//
// # Secrets
//
// Printing Config, AMQPConfig, KafkaConfig, KafkaSASLConfig or NATSConfig
// (String, GoString) redacts URL passwords, the Kafka SASL password, the
// NATS password and token, the Config.Options values whose key contains
// "pass", "secret" or "token" (any case) and the password of every URL in
// them. Errors never quote a secret or a URL that does not parse.
// Marshalling a config yourself (YAML, JSON) does not redact.
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
