package compare

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
)

// clockTick is the unit of /proc/PID/stat's times (USER_HZ, 100 on Linux).
const clockTick = 10 * time.Millisecond

// cpuTime is the CPU time pid used, in user and kernel mode, with that of
// its children (kube-proxy's nft and iptables-restore, Weir's
// iptables-restore): fields utime, stime, cutime and cstime of
// /proc/PID/stat, the last two holding the children it has waited for,
// plus the same of the children still running.
func cpuTime(pid int) (time.Duration, error) {
	own, err := processCPU(pid)
	if err != nil {
		return 0, err
	}
	for _, c := range children(pid) {
		if t, err := processCPU(c); err == nil { // one that just exited counts in cutime
			own += t
		}
	}
	return own, nil
}

// processCPU is one process's utime+stime+cutime+cstime.
func processCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	return parseCPU(string(b))
}

// parseCPU reads the four times from a /proc/PID/stat line. The command
// name, in parentheses, may hold spaces: fields are counted after its
// closing parenthesis, where field 3 (state) comes first.
func parseCPU(stat string) (time.Duration, error) {
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, fmt.Errorf("malformed stat line %q", stat)
	}
	f := strings.Fields(stat[i+1:])
	if len(f) < 15 {
		return 0, fmt.Errorf("malformed stat line %q", stat)
	}
	var total int64
	for _, s := range f[11:15] { // fields 14 to 17
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("malformed stat line %q: %w", stat, err)
		}
		total += v
	}
	return time.Duration(total) * clockTick, nil
}

// memory is a process's resident set now (VmRSS) and at its peak (VmHWM),
// in bytes.
func memory(pid int) (rss, peak int64, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0, err
	}
	rss, peak = statusField(string(b), "VmRSS:"), statusField(string(b), "VmHWM:")
	if rss == 0 || peak == 0 {
		return 0, 0, fmt.Errorf("no VmRSS or VmHWM in /proc/%d/status", pid)
	}
	return rss, peak, nil
}

// statusField reads a "Name:   123 kB" line of /proc/PID/status, in bytes.
func statusField(status, name string) int64 {
	for _, line := range strings.Split(status, "\n") {
		if rest, ok := strings.CutPrefix(line, name); ok {
			f := strings.Fields(rest)
			if len(f) == 0 {
				return 0
			}
			v, _ := strconv.ParseInt(f[0], 10, 64)
			return v << 10
		}
	}
	return 0
}

// children lists pid's child processes.
func children(pid int) []int {
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", pid))
	var out []int
	for _, t := range tasks {
		b, err := os.ReadFile(t)
		if err != nil {
			continue // the thread ended
		}
		for _, f := range strings.Fields(string(b)) {
			if c, err := strconv.Atoi(f); err == nil {
				out = append(out, c)
			}
		}
	}
	return out
}

// comm is the command name of pid, "" once it has exited.
func comm(pid int) string {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid)) // gone: ""
	return strings.TrimSpace(string(b))
}

// childSampler watches a proxy's child processes (nft, iptables-restore)
// every 50 ms and keeps the largest peak RSS it saw in one of them. A
// child's peak grows until it exits, so this is a lower bound.
type childSampler struct {
	stop chan struct{}
	done chan struct{}
	mu   sync.Mutex
	peak int64
}

func sampleChildren(pid int) *childSampler {
	s := &childSampler{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			// Read each time: `ip netns exec` becomes the proxy only
			// once it has exec'd.
			parent := comm(pid)
			for _, c := range children(pid) {
				// A child between fork and exec still shares its parent's
				// memory, and shows the parent's peak: skip it.
				if comm(c) == parent {
					continue
				}
				if _, peak, err := memory(c); err == nil {
					s.mu.Lock()
					s.peak = max(s.peak, peak)
					s.mu.Unlock()
				}
			}
			select {
			case <-s.stop:
				return
			case <-tick.C:
			}
		}
	}()
	return s
}

// finish stops the sampler and returns the largest child peak seen.
func (s *childSampler) finish() int64 {
	select {
	case <-s.stop:
	default:
		close(s.stop)
	}
	<-s.done
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.peak
}
