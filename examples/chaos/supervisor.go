package main

import (
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
	cmd    *exec.Cmd
	done   chan struct{}
	killed bool // set (under the supervisor's lock) before the runner kills or stops it
	err    error
}

// supervisor keeps n loyalty consumers running, as systemd or Kubernetes
// would: a consumer that exits by itself (it gave up, or crashed) is
// restarted after a short backoff and counted. The chaos runner's own
// kills are counted separately.
type supervisor struct {
	bin     string
	env     []string
	logDir  string
	logBase string
	logf    func(format string, args ...any)

	mu         sync.Mutex
	slots      []*proc
	stopping   bool
	started    int
	kills      int
	unexpected int
	startErr   error
	wg         sync.WaitGroup
}

// restartBackoff is how long the supervisor waits before restarting a
// consumer that exited by itself.
const restartBackoff = 500 * time.Millisecond

func newSupervisor(bin string, env []string, logDir, logBase string, n int, logf func(string, ...any)) *supervisor {
	return &supervisor{bin: bin, env: env, logDir: logDir, logBase: logBase, slots: make([]*proc, n), logf: logf}
}

// startAll starts every slot.
func (s *supervisor) startAll() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := range s.slots {
		if err := s.startLocked(i); err != nil {
			return err
		}
	}
	return nil
}

func (s *supervisor) startLocked(i int) error {
	s.started++
	logPath := filepath.Join(s.logDir, fmt.Sprintf("%s-c%d-%03d.log", s.logBase, i, s.started))
	f, err := os.Create(filepath.Clean(logPath))
	if err != nil {
		return err
	}
	cmd := exec.Command(s.bin) //nolint:gosec // the loyalty binary the operator named
	cmd.Env = s.env
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		_ = f.Close()
		return fmt.Errorf("start consumer: %w", err)
	}
	p := &proc{cmd: cmd, done: make(chan struct{})}
	s.slots[i] = p
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		p.err = cmd.Wait()
		_ = f.Close()
		close(p.done)
		s.exited(i, p, logPath)
	}()
	return nil
}

// exited restarts a consumer that ended without being asked to.
func (s *supervisor) exited(i int, p *proc, logPath string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if p.killed || s.stopping || s.slots[i] != p {
		return
	}
	s.unexpected++
	s.logf("   consumer %d exited by itself (%v, log %s); restarting it", i, p.err, logPath)
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

// kill sends SIGKILL to consumer i, waits for it to die, and starts a new
// one in its place.
func (s *supervisor) kill(i int) error {
	s.mu.Lock()
	p := s.slots[i]
	if s.stopping || p == nil {
		s.mu.Unlock()
		return nil
	}
	p.killed = true
	s.mu.Unlock()
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
	s.mu.Lock()
	defer s.mu.Unlock()
	s.kills++
	if s.stopping || s.slots[i] != p {
		return nil
	}
	return s.startLocked(i)
}

// stop ends every consumer with SIGTERM (SIGKILL after grace), so in-flight
// messages finish and Kafka offsets are committed before anything is
// counted.
func (s *supervisor) stop(grace time.Duration) {
	s.mu.Lock()
	s.stopping = true
	procs := append([]*proc(nil), s.slots...)
	for _, p := range procs {
		if p != nil {
			p.killed = true
		}
	}
	s.mu.Unlock()
	for _, p := range procs {
		if p != nil {
			_ = p.cmd.Process.Signal(syscall.SIGTERM)
		}
	}
	for _, p := range procs {
		if p == nil {
			continue
		}
		select {
		case <-p.done:
		case <-time.After(grace):
			_ = p.cmd.Process.Signal(syscall.SIGKILL)
			<-p.done
		}
	}
	s.wg.Wait()
}

// pids returns the process ids of the running consumers.
func (s *supervisor) pids() []int {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []int
	for _, p := range s.slots {
		if p != nil {
			out = append(out, p.cmd.Process.Pid)
		}
	}
	return out
}

type supervisorStats struct {
	kills, unexpected, started int
	startErr                   error
}

func (s *supervisor) stats() supervisorStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return supervisorStats{kills: s.kills, unexpected: s.unexpected, started: s.started, startErr: s.startErr}
}
