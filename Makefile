# claimtx — run `make help` for the targets.
GO        ?= go
PKGS      ?= ./...
# Tests share one Postgres and one RabbitMQ; each isolates itself by schema,
# queue and topic, so packages run in parallel.
TEST_FLAGS ?= -race -count=1 -timeout 20m

.DEFAULT_GOAL := help

.PHONY: help
help: ## Show this help.
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z0-9_-]+:.*## / {printf "  \033[36m%-20s\033[0m %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: demo
demo: ## Run the loyalty consumer on RabbitMQ, Kafka and NATS JetStream with injected trouble and check every balance (starts kfake if no Kafka listens; needs nats-server -js).
	$(GO) build -o bin/loyalty ./examples/loyalty
	$(GO) run ./examples/demo -loyalty bin/loyalty

.PHONY: devkafka
devkafka: ## Run the dev Kafka broker (kfake) on 127.0.0.1:9092 in the foreground.
	$(GO) run ./framework/cmd/devkafka

.PHONY: build
build: ## Compile every package and example.
	$(GO) build $(PKGS)

.PHONY: test
test: test-parallel test-per-message test-disruptive test-pgbouncer test-ha chaos-ha test-browser ## Run every test against the local Postgres, RabbitMQ and in-process Kafka, through PgBouncer, on a Patroni cluster, and the console in Chromium (the CI command); safe beside other work on those servers.

.PHONY: test-per-message
test-per-message: ## The middleware and consumer suites once more with one transaction per message (CLAIM_MAX_GROUP=1), the mode group commit replaced as the default.
	CLAIM_MAX_GROUP=1 $(GO) test $(TEST_FLAGS) ./middleware/ ./framework/consumer/

.PHONY: test-parallel
test-parallel: ## The main suite, with -race; packages run in parallel, each test isolated by schema, queue and topic.
	$(GO) test $(TEST_FLAGS) $(PKGS)

# Tests that drop connections or restart a server: each acts only on a
# server or connections of its own (a private Postgres cluster started with
# the machine's initdb/pg_ctl, RabbitMQ connections closed by their
# connection name, NATS cut at a TCP proxy of the test's), so they leave
# the shared servers and whatever else runs on them alone. They are behind
# the "disruptive" build tag and run one package at a time, after the
# parallel suite, without -race: TestReconnect, TestWindowReconnect and
# TestHealthReconnectAMQP (framework/observe) hit a data race inside
# watermill-amqp's reconnect (see brokers/amqp/doc.go).
# TestChaosDisruptive (internal/chaos) is `make chaos-ci` as a test, on its
# private Postgres cluster and its own RabbitMQ connections.
# It takes a few minutes (Kafka runs at the default session and rebalance
# timeouts), hence -timeout above go test's default 10m.
# Only the packages that have such tests, so every line of the run reports tests that ran.
DISRUPTIVE_PKGS ?= ./brokers/amqp/ ./internal/chaos/ ./examples/loyalty/ ./framework/observe/
.PHONY: test-disruptive
test-disruptive: ## Tests that drop their own connections or restart their own private Postgres cluster, run serially without -race (includes the CI chaos run).
	$(GO) test -count=1 -p 1 -timeout 20m -tags disruptive -run 'Disruptive|Reconnect' $(DISRUPTIVE_PKGS)

# The suites that exercise a consumer's paths (claims per message and in
# batches, the poison memo, the committed-key read-ahead, retention,
# partition maintenance, the horizon check) once more, through a PgBouncer
# of our own in transaction mode (.ci/pgbouncer, Debian's 1.18, installed
# when missing; state under .run/pgbouncer) in front of 127.0.0.1:5432.
# TEST_BEHIND_POOLER makes testenv isolate schemas by a role per schema
# (PgBouncer refuses search_path at start-up) and skips the tests that need
# a real session (a known backend to terminate, LISTEN).
PGBOUNCER_DIR  ?= .run/pgbouncer
PGBOUNCER_PORT ?= 6432
PGBOUNCER_PKGS ?= ./store/... ./middleware/... ./framework/consumer/... ./framework/cmd/claimtx/claimtxcli/
PGBOUNCER_URL   = postgres://postgres@127.0.0.1:$(PGBOUNCER_PORT)/test?sslmode=disable&default_query_exec_mode=exec
PGBOUNCER_DIRECT_URL = postgres://postgres@127.0.0.1:5432/test?sslmode=disable
.PHONY: test-pgbouncer
test-pgbouncer: ## The store, middleware and consumer suites through PgBouncer in transaction mode (installed when missing; PGBOUNCER_PORT, default 6432, must be free).
	bash .ci/pgbouncer stop $(PGBOUNCER_DIR)
	bash .ci/pgbouncer start $(PGBOUNCER_DIR) $(PGBOUNCER_PORT) 127.0.0.1 5432
	TEST_DATABASE_URL='$(PGBOUNCER_URL)' TEST_BEHIND_POOLER=1 TEST_DIRECT_DATABASE_URL='$(PGBOUNCER_DIRECT_URL)' $(GO) test $(TEST_FLAGS) $(PGBOUNCER_PKGS); \
	  rc=$$?; bash .ci/pgbouncer stop $(PGBOUNCER_DIR); exit $$rc

# The failover tests (build tag ha) run on a replicated cluster of their
# own: .ci/ha starts Debian's Patroni with two Postgres nodes
# (127.0.0.1:5433 and :5434) and one etcd, installing patroni and
# etcd-server when missing (quiet when present). The tests kill, lose and
# switch over its leader, so they run serially, and each leaves the cluster
# healthy and asynchronous; the cluster stays up for the next run
# (make ha-down stops it). No -race: they drive separate processes.
HA_PKGS ?= ./store/ ./examples/loyalty/
.PHONY: ha-up
ha-up: ## Start the HA Postgres cluster (Patroni + etcd, nodes on 127.0.0.1:5433 and :5434; installs patroni and etcd-server when missing) and print its multi-host URL; a no-op when it is up.
	bash .ci/ha up

.PHONY: ha-down
ha-down: ## Stop the HA Postgres cluster and remove its state directory (.run/ha, or HA_DIR).
	bash .ci/ha down

.PHONY: test-ha
test-ha: ## Failover tests on the HA cluster (started when not up): consumers on the multi-host URL follow a killed leader, a lost leader machine and a switchover; an acked commit lost with async replication, none with synchronous_mode + remote_apply.
	bash .ci/ha up
	$(GO) test -count=1 -p 1 -timeout 30m -tags ha -run '^TestHA' $(HA_PKGS)

# make chaos-ci on the HA cluster: the consumers' DATABASE_URL is its
# multi-host URL, Patroni's synchronous_mode is on, the consumers' claims
# commit with CLAIM_SYNCHRONOUS_COMMIT=remote_apply (and every other
# session too: a startup parameter in the URL), and
# the run's one Postgres disruption per broker is HA_DISRUPT: alternate (a
# failover for the first broker, a switchover for the second), failover (the
# leader's postmaster SIGKILLed), switchover or lose-node (the leader's
# Patroni and postgres SIGKILLed, restarted once the replica leads). remote_apply covers
# the runner's own CREATE DATABASE too: pgx does not try the next host after
# "database does not exist", so a replica listed first must have applied it.
HA_DISRUPT ?= alternate
.PHONY: chaos-ha
chaos-ha: ## make chaos-ci on the HA cluster (synchronous_mode, remote_apply), the Postgres restart replaced by HA_DISRUPT (alternate: a failover on RabbitMQ, a switchover on Kafka; or failover, switchover, lose-node) once per broker; lost, doubled, wrongly_poisoned, crashes must be 0.
	bash .ci/ha up
	bash .ci/ha sync on
	rm -f "$${HA_DIR:-.run/ha}/alternate"
	$(GO) build -o bin/loyalty ./examples/loyalty
	$(GO) build -o bin/devkafka ./framework/cmd/devkafka
	CLAIM_SYNCHRONOUS_COMMIT=remote_apply DATABASE_URL="$$(bash .ci/ha url)&synchronous_commit=remote_apply" $(CHAOS_TEST) -args -loyalty bin/loyalty -devkafka bin/devkafka -orders 2000 -bad 5 -kills 3 -terms 3 -start-terms 3 -kill-terms 3 -timeout 5m -pg-restart "$(CURDIR)/.ci/ha $(HA_DISRUPT)" $(CHAOS_FLAGS); \
	  rc=$$?; bash .ci/ha up >/dev/null && bash .ci/ha sync off; exit $$rc

# The console's end-to-end test: real loyalty consumers and `claimtx
# console` processes, clicked through in Debian's Chromium by Playwright
# (framework/cmd/claimtx/internal/console/e2e). install.sh installs Chromium and playwright-core
# when they are missing and says nothing when they are there.
BROWSER_TEST = $(GO) test -tags browser -run '^TestBrowser' -count=1 -timeout 10m ./framework/cmd/claimtx/internal/console/
.PHONY: test-browser
test-browser: ## The console in headless Chromium (Playwright): overview, lookup, dead letters, a replay applied exactly once, a parked key retried; installs chromium and node_modules when missing.
	bash framework/cmd/claimtx/internal/console/e2e/install.sh
	$(BROWSER_TEST)

.PHONY: console-screenshots
console-screenshots: ## Run the browser test and keep its screenshots in docs/images (console-*.png).
	bash framework/cmd/claimtx/internal/console/e2e/install.sh
	SCREENSHOT_DIR=$(CURDIR)/docs/images $(BROWSER_TEST)

.PHONY: test-race
test-race: test ## Alias of test: the suite always runs with -race.

.PHONY: test-short
test-short: ## Quick run without the race detector.
	$(GO) test -count=1 -short $(PKGS)

.PHONY: cover
cover: ## Statement coverage of the core packages.
	$(GO) test -count=1 -coverprofile=coverage.txt ./framework/ ./store/ ./middleware/
	$(GO) tool cover -func=coverage.txt | tail -1

.PHONY: api
api: ## Rewrite the golden files of the exported surface (docs/api/*.txt) after an intended API change.
	$(GO) test -count=1 -run '^TestGolden$$' ./docs/api -args -write

.PHONY: api-count
api-count: ## Count the exported identifiers per library package (names, methods, fields).
	$(GO) test -count=1 -run '^TestCount$$' -v ./docs/api | sed -n '/^ *package/,/^ *total/p'

.PHONY: lint
lint: ## gofmt, go vet, staticcheck, golangci-lint (installed on first use from the Go module proxy) and the exported surface against docs/api.
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || (gofmt -l $$(git ls-files '*.go'); echo "gofmt needed"; exit 1)
	$(GO) vet $(PKGS)
	$(GO) vet -tags bench ./internal/bench/
	@command -v staticcheck >/dev/null || $(GO) install honnef.co/go/tools/cmd/staticcheck@latest
	staticcheck $(PKGS)
	@command -v golangci-lint >/dev/null || $(GO) install github.com/golangci/golangci-lint/v2/cmd/golangci-lint@latest
	golangci-lint run $(PKGS)
	$(GO) test -count=1 -run '^TestGolden$$' ./docs/api

FUZZTIME ?= 30s
.PHONY: fuzz
fuzz: ## Run each fuzz target for FUZZTIME (default 30s).
	$(GO) test -run '^$$' -fuzz '^FuzzKeySpec$$' -fuzztime $(FUZZTIME) ./framework/
	$(GO) test -run '^$$' -fuzz '^FuzzCanonicalNumber$$' -fuzztime $(FUZZTIME) ./framework/
	$(GO) test -run '^$$' -fuzz '^FuzzHeaderValueToString$$' -fuzztime $(FUZZTIME) ./brokers/amqp/
	$(GO) test -run '^$$' -fuzz '^FuzzParseConfig$$' -fuzztime $(FUZZTIME) ./brokers/
	$(GO) test -run '^$$' -fuzz '^FuzzOverlayEnv$$' -fuzztime $(FUZZTIME) ./brokers/

BENCH_N ?= 3000
# The throughput, storm and memory runs are TestBench (internal/bench, tag
# bench) with its options after -args; -v streams its tables as it goes.
BENCH = $(GO) test -tags bench -run '^TestBench$$' -count=1 -timeout 0 -v ./internal/bench/ -args

.PHONY: bench
bench: ## Side-by-side throughput (raw pgx / router / router+claimtx / ordered claim / natural-key claim / batch / hand-written consumer) on RabbitMQ and Kafka, written to docs/benchmarks.md; then Go micro-benchmarks of the middleware's own cost.
	$(BENCH) -n $(BENCH_N) -reps 3 -concurrency 1,4,16 -brokers amqp,kafka -write docs/benchmarks.md
	$(GO) test -run '^$$' -bench . -benchmem -count=1 ./framework/ ./middleware/ ./store/

.PHONY: bench-claim
bench-claim: ## The claim's cost per message (BenchmarkClaimCost, BenchmarkClaimPerMessage), with and without the poison memo and order-key lookups, 5 runs each: compare two commits with benchstat.
	$(GO) test -run '^$$' -bench Claim -benchmem -count 5 ./middleware/ ./store/

MEMORY_N ?= 1000000
STORM_N ?= 20000
.PHONY: bench-storm
bench-storm: ## Duplicate storm: STORM_N already-applied messages through claimtx per message and in batches, cold (committed-key cache empty: a fresh process after a group reset) and warm (the same process applied them just before), against the broker's bare consume+ack rate (same subscriber configuration, no database), RabbitMQ and Kafka.
	$(BENCH) -storm $(STORM_N) -reps 3 -concurrency 1,4,16 -brokers amqp,kafka

.PHONY: bench-memory
bench-memory: ## Consumer memory over MEMORY_N messages through RabbitMQ, batch and per-message consumers (per-message takes several minutes per million).
	$(BENCH) -memory $(MEMORY_N) -memory-mode batch -concurrency 4
	$(BENCH) -memory $(MEMORY_N) -memory-mode message -concurrency 16

BENCH_ROWS ?= 10000000
.PHONY: bench-retention
bench-retention: ## Retention at scale (several minutes, own schemas, dropped after): COPY BENCH_ROWS claims, cleanup rate, claim p99 during cleanup, partition drop, claim throughput full vs empty.
	BENCH_ROWS=$(BENCH_ROWS) $(GO) test -tags benchretention -run '^TestRetentionAtScale$$' -count=1 -timeout 90m -v ./store/

BENCH_REPLAY_N ?= 100000
.PHONY: bench-replay
bench-replay: ## `claimtx dlq replay` throughput (messages/s) of BENCH_REPLAY_N dead letters on RabbitMQ and Kafka, dry run and replay (own queues, topics and schemas).
	BENCH_REPLAY_N=$(BENCH_REPLAY_N) $(GO) test -tags benchreplay -run '^TestReplayThroughput$$' -count=1 -timeout 60m -v ./framework/cmd/claimtx/claimtxcli/

BENCH_CLAIMS ?= 10000000
BENCH_LETTERS ?= 100000
.PHONY: bench-console
bench-console: ## Console page times at scale: BENCH_CLAIMS claims over 30 days, BENCH_LETTERS dead letters on RabbitMQ and Kafka, each page requested 5 times (own schema, queues and topics).
	BENCH_CLAIMS=$(BENCH_CLAIMS) BENCH_LETTERS=$(BENCH_LETTERS) $(GO) test -tags benchconsole -run '^TestPageTimes$$' -count=1 -timeout 60m -v ./framework/cmd/claimtx/internal/console/

# The chaos run restarts a private Postgres cluster of its own and closes
# only its own RabbitMQ connections (CHAOS_FLAGS='-pg-restart "CMD"
# -amqp-disrupt all' restart the DATABASE_URL server and close everyone's:
# opt-in, run alone). Its load wants a quiet machine.
# The harness is test code (internal/chaos, build tag chaos); its knobs are
# test flags after -args, paths relative to the module root. -v streams its
# output as it runs; each broker bounds itself (-timeout), so go test does not.
CHAOS_FLAGS ?=
CHAOS_TEST = $(GO) test -tags chaos -v -count=1 -timeout 0 -run '^TestChaos$$' ./internal/chaos/
.PHONY: chaos
chaos: ## Chaos run per broker: 20,000 orders, 3 consumers cold-started at once on a fresh database, >= 15 SIGKILLs and >= 15 SIGTERM rolling restarts, on Kafka (default timeouts) >= 10 SIGTERMs of consumers still joining and >= 10 right after a SIGKILL, a Postgres restart, a broker disruption; fails unless lost, doubled, wrongly_poisoned, crashes and hung_shutdowns (no exit within drain timeout + 5s of SIGTERM) are 0 (on a private Postgres cluster and its own RabbitMQ connections).
	$(GO) build -o bin/loyalty ./examples/loyalty
	$(GO) build -o bin/devkafka ./framework/cmd/devkafka
	$(CHAOS_TEST) -args -loyalty bin/loyalty -devkafka bin/devkafka $(CHAOS_FLAGS)

.PHONY: chaos-batch
chaos-batch: ## make chaos with the consumers in batch mode (BATCH_SIZE=64, 2 workers).
	BATCH_SIZE=64 BATCH_WORKERS=2 $(MAKE) chaos

.PHONY: chaos-order
chaos-order: ## make chaos in order mode (CHAOS_ORDER=1): ORDER_KEY by customer, CONCURRENCY=1, ~1 in 200 orders refused for good (LOYALTY_REJECT_ORDERS) and parked, one RabbitMQ consumer (Kafka keyed by customer), `claimtx parked skip --all` at the end; also fails unless out_of_order is 0 and every rejected order is poisoned, none credited.
	CHAOS_ORDER=1 $(MAKE) chaos

.PHONY: chaos-quorum
chaos-quorum: ## make chaos on RabbitMQ only, on quorum queues (AMQP_QUEUE_TYPE=quorum for the consumers).
	$(MAKE) chaos CHAOS_FLAGS="-brokers amqp -amqp-queue-type quorum $(CHAOS_FLAGS)"

.PHONY: chaos-pgbouncer
chaos-pgbouncer: ## make chaos with the consumers behind a PgBouncer of the run's own in transaction mode (DATABASE_URL with default_query_exec_mode=exec), in front of the private cluster.
	$(MAKE) chaos CHAOS_FLAGS="-pgbouncer $(CHAOS_FLAGS)"

.PHONY: chaos-ci
chaos-ci: ## The short chaos run (2,000 orders, >= 3 SIGKILLs and >= 3 SIGTERMs per broker, on Kafka >= 3 of each joining SIGTERM, default timeouts; a few minutes); `make test` runs it as TestChaosDisruptive.
	$(GO) build -o bin/loyalty ./examples/loyalty
	$(GO) build -o bin/devkafka ./framework/cmd/devkafka
	$(CHAOS_TEST) -args -loyalty bin/loyalty -devkafka bin/devkafka -orders 2000 -bad 5 -kills 3 -terms 3 -start-terms 3 -kill-terms 3 -timeout 5m $(CHAOS_FLAGS)
