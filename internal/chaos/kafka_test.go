package chaos

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/claimtx/claimtx/brokers/kafka/kafkatest"
	"github.com/claimtx/claimtx/examples/loyalty/feed"
)

// partitions of the chaos topic: two per consumer process.
const partitions = 6

// kafkaOps runs a Kafka broker with a data directory, so the chaos run can
// stop and start it on the same address: the dev broker
// (framework/cmd/devkafka) as a subprocess, or a plain kfake cluster in
// this process (-kafka-broker kfake). It publishes like a plain franz-go
// producer (kafkaRecord).
type kafkaOps struct {
	topic, group string
	addr         string
	// byCustomer keys each order's record by its customer (order mode),
	// as a producer of ordered events does, instead of by event id.
	byCustomer bool
	broker     kafkaServer
	cl         *kgo.Client
	adm        *kadm.Client
}

// kafkaServer is a broker on one address and data directory; start and
// stop may alternate any number of times.
type kafkaServer interface {
	start(ctx context.Context) error
	stop() error
	// what names it in the disruption's log line.
	what() string
	// evictions is how many silent group members it evicted, -1 when it
	// does not evict.
	evictions() int
}

func (k *kafkaOps) name() string { return "kafka" }

func (k *kafkaOps) prepare(ctx context.Context) error {
	if err := k.broker.start(ctx); err != nil {
		return err
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(k.addr), kgo.ProducerLinger(0),
		kgo.RetryTimeout(time.Minute), kgo.RecordDeliveryTimeout(2*time.Minute))
	if err != nil {
		return err
	}
	k.cl, k.adm = cl, kadm.NewClient(cl)
	return feed.CreateKafkaTopics(ctx, k.adm, k.topic, partitions)
}

// publish produces ds; franz-go retries through a broker restart by itself.
func (k *kafkaOps) publish(ctx context.Context, ds []delivery) (int, error) {
	recs := make([]*kgo.Record, len(ds))
	for i, d := range ds {
		recs[i] = feed.KafkaRecord(k.topic, d.eventID, d.payload)
		if k.byCustomer && d.customer != "" {
			recs[i].Key = []byte(d.customer)
		}
	}
	if err := k.cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		return 0, fmt.Errorf("produce: %w", err)
	}
	return len(ds), nil
}

// lag sums, over the topic's partitions, what the group has not committed.
func (k *kafkaOps) lag(ctx context.Context) (int64, bool, error) {
	lags, err := k.adm.Lag(ctx, k.group)
	if err != nil {
		return 0, false, err
	}
	l, ok := lags[k.group]
	if !ok {
		return 0, false, errors.New("group not described")
	}
	if err := l.Error(); err != nil {
		return 0, false, err
	}
	var total int64
	seen := 0
	for _, p := range l.Lag[k.topic] {
		if p.End.Err != nil {
			return 0, false, p.End.Err
		}
		seen++
		if p.Commit.At < 0 {
			total += p.End.Offset
			continue
		}
		total += p.End.Offset - p.Commit.At
	}
	return total, seen == partitions, nil
}

// drained: the group's committed offsets reached the end of every partition.
func (k *kafkaOps) drained(ctx context.Context) (bool, error) {
	n, complete, err := k.lag(ctx)
	return err == nil && complete && n == 0, err
}

func (k *kafkaOps) remaining(ctx context.Context) (int, error) {
	n, complete, err := k.lag(ctx)
	if err != nil {
		return 0, err
	}
	if !complete {
		return 0, errors.New("the group has no offsets for some partitions")
	}
	return int(n), nil
}

func (k *kafkaOps) poisonedCount(ctx context.Context) (int, error) {
	return feed.KafkaTopicSize(ctx, k.adm, k.topic+".poison")
}

// poisoned reads the poison topic from the start and returns each
// record's event_id and poison reason headers.
func (k *kafkaOps) poisoned(ctx context.Context) ([]poisonedMsg, error) {
	want, err := k.poisonedCount(ctx)
	if err != nil || want == 0 {
		return nil, err
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(k.addr), kgo.ConsumeTopics(k.topic+".poison"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var ids []poisonedMsg
	for len(ids) < want {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return ids, fmt.Errorf("read poison topic: %d of %d records: %w", len(ids), want, err)
		}
		fs.EachRecord(func(r *kgo.Record) {
			var m poisonedMsg
			for _, h := range r.Headers {
				switch h.Key {
				case "event_id":
					m.eventID = string(h.Value)
				case poisonReasonKey:
					m.reason = string(h.Value)
				}
			}
			ids = append(ids, m)
		})
	}
	return ids, nil
}

// disrupt stops the broker (it saves its data directory) and starts it
// again on the same address.
func (k *kafkaOps) disrupt(ctx context.Context) (string, error) {
	start := time.Now()
	if err := k.broker.stop(); err != nil {
		return "", err
	}
	if err := k.broker.start(ctx); err != nil {
		return "", err
	}
	return fmt.Sprintf("%s stopped and started on its data directory (down %s)", k.broker.what(), time.Since(start).Round(time.Millisecond)), nil
}

// groupState describes the consumer group for the log, its state and
// how many members it has, and says whether it is rebalancing
// (PreparingRebalance: members join; CompletingRebalance: they sync).
func (k *kafkaOps) groupState(ctx context.Context) (string, bool) {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	gs, err := k.adm.DescribeGroups(ctx, k.group)
	if err != nil {
		return "group state unknown: " + err.Error(), false
	}
	g, ok := gs[k.group]
	if !ok {
		return "group not described", false
	}
	if g.Err != nil {
		return "group state unknown: " + g.Err.Error(), false
	}
	return fmt.Sprintf("group %s with %d members", g.State, len(g.Members)),
		g.State == "PreparingRebalance" || g.State == "CompletingRebalance"
}

func (k *kafkaOps) close() {
	if k.cl != nil {
		k.cl.Close()
	}
	_ = k.broker.stop()
}

// devKafka is one framework/cmd/devkafka process (kfake plus the
// eviction of members that died while joining, brokers/kafka/kafkatest); start
// and stop may alternate any number of times, always on the same address
// and data directory.
type devKafka struct {
	bin, addr, dataDir, logPath string
	cmd                         *exec.Cmd
	done                        chan struct{}
	logFile                     *os.File
}

// freeAddr returns a loopback address nobody listens on right now.
func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	addr := ln.Addr().String()
	return addr, ln.Close()
}

func (d *devKafka) start(ctx context.Context) error {
	f, err := os.OpenFile(filepath.Clean(d.logPath), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	cmd := exec.Command(d.bin, "-addr", d.addr, "-data-dir", d.dataDir, "-partitions", fmt.Sprint(partitions)) //nolint:gosec // the binary the operator named
	cmd.Stderr = f
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		_ = f.Close()
		return err
	}
	if err := cmd.Start(); err != nil {
		_ = f.Close()
		return fmt.Errorf("start devkafka: %w", err)
	}
	d.cmd, d.logFile, d.done = cmd, f, make(chan struct{})
	ready := make(chan error, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		signalled := false
		for sc.Scan() {
			if !signalled && strings.HasPrefix(sc.Text(), "devkafka listening on ") {
				ready <- nil
				signalled = true
			}
		}
		if !signalled {
			ready <- errors.New("devkafka exited before it listened (see " + d.logPath + ")")
		}
	}()
	go func(done chan struct{}) {
		_ = cmd.Wait()
		_ = f.Close()
		close(done)
	}(d.done)
	select {
	case err := <-ready:
		return err
	case <-time.After(30 * time.Second):
		return errors.New("devkafka did not listen within 30s")
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (d *devKafka) what() string { return "devkafka" }

// evictions counts the evictions the dev broker logged.
func (d *devKafka) evictions() int {
	b, err := os.ReadFile(filepath.Clean(d.logPath))
	if err != nil {
		return -1
	}
	return bytes.Count(b, []byte("kafkatest: evicted silent group member"))
}

func (d *devKafka) stop() error {
	if d.cmd == nil {
		return nil
	}
	defer func() { d.cmd = nil }()
	select {
	case <-d.done:
		return nil
	default:
	}
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.done:
		return nil
	case <-time.After(30 * time.Second):
		_ = d.cmd.Process.Kill()
		<-d.done
		return errors.New("devkafka did not stop within 30s of SIGTERM; killed")
	}
}

// kfakeServer is a plain kfake cluster in this process: brokers/kafka/kafkatest
// with its eviction off, so a member SIGKILLed while joining stays in the
// group as kfake leaves it (DESIGN.md, the kfake gap). Same address, data
// directory and partitions as devKafka; its log goes to logPath.
type kfakeServer struct {
	addr, dataDir, logPath string
	b                      *kafkatest.Broker
	logFile                *os.File
}

func (k *kfakeServer) what() string { return "kfake (in process, no eviction)" }

func (k *kfakeServer) evictions() int { return -1 }

func (k *kfakeServer) start(ctx context.Context) error {
	f, err := os.OpenFile(filepath.Clean(k.logPath), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	// Not ctx: the broker must outlive a cancelled run until close.
	b, err := kafkatest.Start(context.WithoutCancel(ctx), kafkatest.Options{
		Addr: k.addr, DataDir: k.dataDir, Partitions: partitions, DisableEviction: true,
		Logger: slog.New(slog.NewTextHandler(f, &slog.HandlerOptions{Level: slog.LevelInfo})),
	})
	if err != nil {
		_ = f.Close()
		return fmt.Errorf("start kfake: %w", err)
	}
	k.b, k.logFile = b, f
	return nil
}

func (k *kfakeServer) stop() error {
	if k.b == nil {
		return nil
	}
	err := k.b.Close()
	_ = k.logFile.Close()
	k.b, k.logFile = nil, nil
	return err
}
