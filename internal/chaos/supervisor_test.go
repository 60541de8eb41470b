package chaos

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"
)

// proc is one loyalty consumer process.
type proc struct {
	cmd     *exec.Cmd
	logPath string
	done    chan struct{}
	// signalled is the signal the runner sent it (SIGKILL or SIGTERM), set
	// under the supervisor's lock before sending; 0 while nobody asked it
	// to stop. It tells an exit we caused from one the consumer chose.
	signalled syscall.Signal
	// hung is set (under the lock, before the SIGKILL) when it did not
	// exit within the timeout after SIGTERM.
	hung bool
	err  error
	// started is when the process was started, exitedAt when it ended
	// (set before done closes).
	started, exitedAt time.Time
}

// termKind says when a SIGTERM reached its consumer.
type termKind int

const (
	// termReady is a rolling restart of a consumer that consumes, while
	// the consumers are at work.
	termReady termKind = iota
	// termStarting hits a consumer shortly after its (re)start: as soon
	// as it logs (it is subscribing, before it joined the group) or a
	// moment after it began consuming (while the group rebalances for it).
	termStarting
	// termAfterKill hits another consumer 1-2 s after a SIGKILL, a
	// rolling deploy that meets a crash: the group is rebalancing.
	termAfterKill
	// termFinal is the final stop, every consumer at once.
	termFinal
	termKinds
)

var termKindNames = [termKinds]string{"ready", "starting", "after_kill", "final"}

func (k termKind) String() string { return termKindNames[k] }

// supervisor keeps n loyalty consumers running, as systemd or Kubernetes
// would: a consumer that exits by itself (it gave up, crashed, or failed
// to start) is restarted after a short backoff and counted as a crash. The
// runner's own SIGKILLs and SIGTERMs are counted apart; a consumer that
// exits non-zero after our SIGTERM is a crash too (a graceful stop ends
// with status 0), and one that does not exit within the timeout is a hung
// shutdown. How long every SIGTERMed consumer took to exit is recorded.
type supervisor struct {
	bin     string
	env     []string
	logDir  string
	logBase string
	logf    func(format string, args ...any)

	mu       sync.Mutex
	slots    []*proc
	stopping bool
	started  int
	kills    int
	terms    [termKinds]int
	exits    [termKinds][]time.Duration // SIGTERM to exit, per kind (a hung one: to its SIGKILLed end)
	crashes  int
	hung     int
	startErr error
	wg       sync.WaitGroup
}

// restartBackoff is how long the supervisor waits before restarting a
// consumer that exited by itself.
const restartBackoff = 500 * time.Millisecond

// readyTimeout bounds the wait for a consumer to consume before a rolling
// restart or the final stop SIGTERMs it anyway.
const readyTimeout = time.Minute

// readyMark is what loyalty logs once it consumes, in both modes (after
// its tables and the claim store's migrations exist).
var readyMark = []byte("loyalty: consuming")

func newSupervisor(bin string, env []string, logDir, logBase string, n int, logf func(string, ...any)) *supervisor {
	return &supervisor{bin: bin, env: env, logDir: logDir, logBase: logBase, slots: make([]*proc, n), logf: logf}
}

// startAll starts every slot at once: the cold start of a deploy, where
// every replica runs its start-up DDL against the same empty database at
// the same moment. The commands are prepared first so the starts follow
// each other within microseconds instead of behind each other's file
// creation.
func (s *supervisor) startAll() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	starts := make([]func() error, len(s.slots))
	for i := range s.slots {
		start, err := s.prepareLocked(i)
		if err != nil {
			return err
		}
		starts[i] = start
	}
	for _, start := range starts {
		if err := start(); err != nil {
			return err
		}
	}
	return nil
}

func (s *supervisor) startLocked(i int) error {
	start, err := s.prepareLocked(i)
	if err != nil {
		return err
	}
	return start()
}

// prepareLocked builds consumer i's command and log file and returns the
// function that starts it (to be called with the lock held).
func (s *supervisor) prepareLocked(i int) (func() error, error) {
	s.started++
	logPath := filepath.Join(s.logDir, fmt.Sprintf("%s-c%d-%03d.log", s.logBase, i, s.started))
	f, err := os.Create(filepath.Clean(logPath))
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(s.bin) //nolint:gosec // the loyalty binary the operator named
	cmd.Env = s.env
	cmd.Stdout, cmd.Stderr = f, f
	return func() error {
		if err := cmd.Start(); err != nil {
			_ = f.Close()
			return fmt.Errorf("start consumer: %w", err)
		}
		p := &proc{cmd: cmd, logPath: logPath, done: make(chan struct{}), started: time.Now()}
		s.slots[i] = p
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			p.err = cmd.Wait()
			p.exitedAt = time.Now()
			_ = f.Close()
			close(p.done)
			s.exited(i, p)
		}()
		return nil
	}, nil
}

// exited classifies an exit: our SIGKILL is expected, a zero status
// after our SIGTERM is a graceful stop, a hung shutdown is counted by
// terminate; anything else is a crash. A consumer that ended by itself is
// restarted, as a supervisor would.
func (s *supervisor) exited(i int, p *proc) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case p.signalled == syscall.SIGKILL || p.hung:
		return
	case p.signalled == syscall.SIGTERM:
		if p.err != nil {
			s.crashes++
			s.logf("   CRASH: consumer %d exited with %v after SIGTERM instead of 0 (log %s)", i, p.err, p.logPath)
		}
		return
	}
	s.crashes++
	status := "status 0"
	if p.err != nil {
		status = p.err.Error()
	}
	s.logf("   CRASH: consumer %d exited by itself (%s, log %s)%s", i, status, p.logPath, lastLine(p.logPath))
	if s.stopping || s.slots[i] != p {
		return
	}
	time.AfterFunc(restartBackoff, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.stopping || s.slots[i] != p {
			return
		}
		if err := s.startLocked(i); err != nil && s.startErr == nil {
			s.startErr = err
		}
	})
}

// lastLine returns the last line of a log, for the crash message.
func lastLine(path string) string {
	b, err := os.ReadFile(filepath.Clean(path))
	if err != nil {
		return ""
	}
	b = bytes.TrimRight(b, "\n")
	if i := bytes.LastIndexByte(b, '\n'); i >= 0 {
		b = b[i+1:]
	}
	if len(b) == 0 {
		return ""
	}
	return ": " + string(b)
}

// claim marks consumer i as signalled by us and returns it (nil when the
// supervisor is stopping, the slot is empty, holds another process than
// want (when given) or one that already exited: an exit of its own must
// stay a crash).
func (s *supervisor) claim(i int, sig syscall.Signal, want *proc) *proc {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.slots[i]
	if s.stopping || p == nil || (want != nil && p != want) {
		return nil
	}
	select {
	case <-p.done:
		return nil
	default:
	}
	p.signalled = sig
	return p
}

// replace counts a finished kill or termination and starts consumer i's
// replacement.
func (s *supervisor) replace(i int, p *proc, count *int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	*count++
	if s.stopping || s.slots[i] != p {
		return nil
	}
	return s.startLocked(i)
}

// current returns consumer i's process (nil if none).
func (s *supervisor) current(i int) *proc {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.slots[i]
}

// kill sends SIGKILL to consumer i, waits for it to die, and starts a new
// one in its place. It reports false when there was no live consumer to
// kill (it had just exited by itself).
func (s *supervisor) kill(i int) (bool, error) {
	p := s.claim(i, syscall.SIGKILL, nil)
	if p == nil {
		return false, nil
	}
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
	return true, s.replace(i, p, &s.kills)
}

// terminate SIGTERMs consumer i and gives it timeout to exit by itself;
// if it does not, that is a hung shutdown, and it is SIGKILLed. Then a
// replacement starts. at runs first, with the process to be stopped, and
// returns when the SIGTERM is due: for a rolling restart of a ready
// consumer (termReady) once it consumes and the consumers are at work (a
// rolling deploy replaces an instance that is ready), for the other kinds
// at some point of its start or of a rebalance. The signal goes out only
// if that same process is still running then. It returns how long the
// shutdown took, and ok false when there was no live consumer i to stop.
func (s *supervisor) terminate(ctx context.Context, i int, timeout time.Duration, kind termKind, at func(*proc) error) (took time.Duration, hung, ok bool, err error) {
	p := s.current(i)
	if p == nil {
		return 0, false, false, nil
	}
	if err := at(p); err != nil {
		return 0, false, false, err
	}
	if ctx.Err() != nil {
		return 0, false, false, ctx.Err()
	}
	if p = s.claim(i, syscall.SIGTERM, p); p == nil {
		return 0, false, false, nil
	}
	start := time.Now()
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-p.done:
	case <-t.C:
		hung = true
		s.markHung(fmt.Sprintf("consumer %d (SIGTERM %s)", i, kind), p, timeout)
		_ = p.cmd.Process.Signal(syscall.SIGKILL)
		<-p.done
	}
	took = time.Since(start)
	s.mu.Lock()
	s.exits[kind] = append(s.exits[kind], took)
	s.mu.Unlock()
	return took, hung, true, s.replace(i, p, &s.terms[kind])
}

// awaitLogged waits until p wrote its first log line (its signal handler
// is installed by then: a SIGTERM before it would kill it, a crash that
// proves nothing), p exits, or timeout passes.
func awaitLogged(ctx context.Context, p *proc, timeout time.Duration) error {
	return awaitLog(ctx, p, timeout, 10*time.Millisecond, func() bool {
		fi, err := os.Stat(filepath.Clean(p.logPath))
		return err == nil && fi.Size() > 0
	})
}

// awaitLog polls seen every interval until it is true, p exits, ctx ends
// or timeout passes.
func awaitLog(ctx context.Context, p *proc, timeout, interval time.Duration, seen func() bool) error {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if seen() {
			return nil
		}
		select {
		case <-p.done:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(interval):
		}
	}
	return nil
}

func (s *supervisor) markHung(who string, p *proc, timeout time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p.hung = true
	s.hung++
	s.logf("   HUNG SHUTDOWN: %s still running %s after SIGTERM; SIGKILL (log %s)", who, timeout, p.logPath)
}

// awaitReady polls p's log until it says it consumes, p exits (its exit
// is a crash, counted when it happens), or timeout passes (then the
// SIGTERM goes to a consumer still starting, which must stop cleanly too).
func awaitReady(ctx context.Context, p *proc, timeout time.Duration) error {
	return awaitLog(ctx, p, timeout, 100*time.Millisecond, func() bool {
		b, err := os.ReadFile(filepath.Clean(p.logPath))
		return err == nil && bytes.Contains(b, readyMark)
	})
}

// stop ends every consumer with SIGTERM, the way a deploy's final scale
// down does, so in-flight messages finish and Kafka offsets are committed
// before anything is counted. An exit other than 0 is a crash, one that
// takes longer than grace a hung shutdown. Calling it again waits only.
func (s *supervisor) stop(grace time.Duration) {
	s.mu.Lock()
	if s.stopping {
		s.mu.Unlock()
		s.wg.Wait()
		return
	}
	s.stopping = true
	live := func() []*proc {
		var procs []*proc
		for _, p := range s.slots {
			if p == nil {
				continue
			}
			select {
			case <-p.done:
				continue
			default:
			}
			procs = append(procs, p)
		}
		return procs
	}
	procs := live()
	s.mu.Unlock()
	// A replacement started a moment ago may not have installed its
	// signal handler yet, and would die of the SIGTERM itself: give each
	// the time to start consuming first, as the rolling restarts do. One
	// that exits meanwhile stays a crash.
	for _, p := range procs {
		_ = awaitReady(context.Background(), p, readyTimeout)
	}
	s.mu.Lock()
	procs = live()
	for _, p := range procs {
		p.signalled = syscall.SIGTERM
	}
	s.mu.Unlock()
	start := time.Now()
	for _, p := range procs {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
	}
	deadline := time.NewTimer(grace)
	defer deadline.Stop()
	var exits []time.Duration
	for i, p := range procs {
		select {
		case <-p.done:
		case <-deadline.C:
			// Every later one is past the deadline too.
			for _, q := range procs[i:] {
				select {
				case <-q.done:
				default:
					s.markHung("at the final stop, a consumer", q, grace)
					_ = q.cmd.Process.Signal(syscall.SIGKILL)
				}
			}
		}
		<-p.done
	}
	s.wg.Wait()
	// Each one's own exit time: the exit is recorded (cmd.Wait returned)
	// before done closes.
	for _, p := range procs {
		exits = append(exits, p.exitedAt.Sub(start))
	}
	s.mu.Lock()
	s.exits[termFinal] = append(s.exits[termFinal], exits...)
	s.terms[termFinal] += len(procs)
	s.mu.Unlock()
}

type supervisorStats struct {
	kills, crashes, hung, started int
	// terms counts the SIGTERMs per kind; terms[termReady] are the
	// rolling restarts.
	terms    [termKinds]int
	exits    [termKinds][]time.Duration
	startErr error
}

func (s *supervisor) stats() supervisorStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := supervisorStats{kills: s.kills, terms: s.terms, crashes: s.crashes, hung: s.hung, started: s.started, startErr: s.startErr}
	for k := range s.exits {
		st.exits[k] = append([]time.Duration(nil), s.exits[k]...)
	}
	return st
}
