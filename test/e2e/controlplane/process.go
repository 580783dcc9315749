package controlplane

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"time"
)

// stopTimeout bounds how long a process may take to exit after SIGTERM
// before it is killed.
const stopTimeout = 10 * time.Second

// logTail is how much of each process's log a failed test prints.
const logTail = 64 << 10

// process is one running binary of the control plane, its output appended
// to a log file.
type process struct {
	name string
	log  string
	cmd  *exec.Cmd
	done chan struct{} // closed when the process has exited
	err  error         // its exit status, once done is closed
}

// startProcess starts bin with args, appending its stdout and stderr to
// logPath. The process dies with the test binary (SIGKILL on the parent's
// death), so a crashed test leaves nothing running.
func startProcess(name, bin, logPath string, args ...string) (*process, error) {
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(logFile, "=== %s %s: %s %q\n", time.Now().Format(time.RFC3339Nano), name, bin, args)
	cmd := exec.Command(bin, args...)
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &process{name: name, log: logPath, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		logFile.Close()
		close(p.done)
	}()
	return p, nil
}

// exited reports whether the process has ended, and how, without waiting.
func (p *process) exited() (bool, error) {
	select {
	case <-p.done:
		if p.err == nil {
			return true, fmt.Errorf("%s exited", p.name)
		}
		return true, fmt.Errorf("%s exited: %w", p.name, p.err)
	default:
		return false, nil
	}
}

// stop ends the process: SIGTERM to its process group, then SIGKILL after
// stopTimeout. It waits for the exit and is safe to call more than once.
func (p *process) stop() error {
	if done, _ := p.exited(); done {
		return nil
	}
	pgid := -p.cmd.Process.Pid
	if err := syscall.Kill(pgid, syscall.SIGTERM); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("stop %s: %w", p.name, err)
	}
	timer := time.NewTimer(stopTimeout)
	defer timer.Stop()
	select {
	case <-p.done:
		return nil
	case <-timer.C:
	}
	if err := syscall.Kill(pgid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("kill %s: %w", p.name, err)
	}
	<-p.done
	return fmt.Errorf("%s ignored SIGTERM for %v and was killed", p.name, stopTimeout)
}

// tail is the end of the process's log, at most logTail bytes.
func (p *process) tail() string {
	b, err := os.ReadFile(p.log)
	if err != nil {
		return fmt.Sprintf("(reading %s: %v)", p.log, err)
	}
	if len(b) > logTail {
		b = b[len(b)-logTail:]
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			b = b[i+1:]
		}
		b = append([]byte("[... earlier lines cut ...]\n"), b...)
	}
	return string(b)
}
