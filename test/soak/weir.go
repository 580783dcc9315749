package soak

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/weirproxy/weir/test/netns"
)

// Weir's servers in the node namespace (which has its own loopback).
const (
	metricsAddr = "127.0.0.1:10249"
	healthzAddr = "127.0.0.1:10256"
)

// daemon runs `weir run` in the node namespace, one process at a time.
type daemon struct {
	bin, config string
	node        *netns.Namespace
	env         []string
	dir         string // logs: weir-<n>.log
	http        *http.Client
	logf        func(format string, args ...any)

	mu     sync.Mutex
	cur    *weirProc
	starts int
}

// weirProc is one weir run process.
type weirProc struct {
	cmd     *exec.Cmd
	started time.Time
	logPath string
	done    chan struct{} // closed once it has exited
	err     error
	// fullSync receives (without blocking) when the process logs the start
	// of a full sync.
	fullSync chan struct{}
	// flavour is the iptables flavour it logged, once it did.
	flavour atomic.Pointer[string]
	// synced is when it logged its first successful sync; starting when
	// it logged "Starting Weir", with its plugins loaded.
	synced, starting atomic.Pointer[time.Time]
}

// pluginLoad is the time from the start to "Starting Weir": mostly the
// plugins' loading; 0 when not logged yet.
func (p *weirProc) pluginLoad() time.Duration {
	if t := p.starting.Load(); t != nil {
		return t.Sub(p.started)
	}
	return 0
}

// loggedFlavour is the iptables flavour the process logged, or "".
func (p *weirProc) loggedFlavour() string {
	if f := p.flavour.Load(); f != nil {
		return *f
	}
	return ""
}

// firstSync is the time from the start to the first successful sync, or
// 0 when there was none yet.
func (p *weirProc) firstSync() time.Duration {
	if t := p.synced.Load(); t != nil {
		return t.Sub(p.started)
	}
	return 0
}

func newDaemon(bin, config, dir string, node *netns.Namespace, env []string, logf func(string, ...any)) *daemon {
	return &daemon{bin: bin, config: config, node: node, env: env, dir: dir, http: node.HTTPClient(3 * time.Second), logf: logf}
}

// start runs a new weir run process; the previous one must have exited.
func (d *daemon) start() (*weirProc, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.starts++
	p := &weirProc{logPath: filepath.Join(d.dir, fmt.Sprintf("weir-%d.log", d.starts)),
		done: make(chan struct{}), fullSync: make(chan struct{}, 1)}
	logFile, err := os.Create(p.logPath)
	if err != nil {
		return nil, err
	}
	pr, pw := io.Pipe()
	// `ip netns exec` execs weir in place: signals reach weir itself.
	p.cmd = d.node.Command(context.Background(), d.bin, "run", "--config", d.config)
	p.cmd.Env = d.env
	p.cmd.Stdout, p.cmd.Stderr = pw, pw
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	p.started = time.Now()
	if err := p.cmd.Start(); err != nil {
		logFile.Close()
		return nil, fmt.Errorf("start weir run: %w", err)
	}
	scanned := make(chan struct{})
	go func() {
		p.scan(pr, logFile)
		close(scanned)
	}()
	go func() {
		p.err = p.cmd.Wait()
		pw.Close()
		<-scanned
		logFile.Close()
		close(p.done)
	}()
	d.cur = p
	return p, nil
}

// fullSyncLine is what weir logs when a full sync starts.
var fullSyncLine = regexp.MustCompile(`msg="Syncing rules" full=true`)

var syncedLine = regexp.MustCompile(`msg="Synced rules"`)

var flavourLine = regexp.MustCompile(`msg="Using (?:iptables|IPVS)" .*?flavour=(\w+)`)

// scan copies the process's output to its log and watches for the lines
// the faults wait for.
func (p *weirProc) scan(r io.Reader, log io.Writer) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		fmt.Fprintln(log, line)
		if fullSyncLine.MatchString(line) {
			select {
			case p.fullSync <- struct{}{}:
			default:
			}
		}
		if m := flavourLine.FindStringSubmatch(line); m != nil {
			p.flavour.Store(&m[1])
		}
		if p.starting.Load() == nil && strings.Contains(line, `msg="Starting Weir"`) {
			now := time.Now()
			p.starting.Store(&now)
		}
		if p.synced.Load() == nil && syncedLine.MatchString(line) {
			now := time.Now()
			p.synced.Store(&now)
		}
	}
	_, _ = io.Copy(io.Discard, r) // drains the pipe until weir exits; its end is no error
}

// running reports whether the current process has not exited.
func (d *daemon) running() bool {
	p := d.current()
	if p == nil {
		return false
	}
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// startCount is how many processes were started.
func (d *daemon) startCount() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.starts
}

func (d *daemon) current() *weirProc {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.cur
}

// kill sends SIGKILL and waits for the exit.
func (d *daemon) kill() {
	p := d.current()
	if p == nil {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGKILL) // fails only when the process has exited already
	<-p.done
}

// term sends SIGTERM and waits up to limit for the exit, then kills; it
// returns how long the process took to stop and whether it did by itself.
func (d *daemon) term(limit time.Duration) (time.Duration, bool) {
	p := d.current()
	if p == nil {
		return 0, true
	}
	begin := time.Now()
	_ = p.cmd.Process.Signal(syscall.SIGTERM) // fails only when the process has exited already
	select {
	case <-p.done:
		return time.Since(begin), true
	case <-time.After(limit):
	}
	d.kill()
	return time.Since(begin), false
}

// metrics is one scrape of Weir's /metrics: each series' value by its
// name (labels summed).
type metrics map[string]float64

// The series the soak reads.
const (
	mLastSync      = "kubeproxy_sync_proxy_rules_last_timestamp_seconds"
	mLastQueued    = "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds"
	mPendingSvc    = "kubeproxy_sync_proxy_rules_service_changes_pending"
	mPendingEP     = "kubeproxy_sync_proxy_rules_endpoint_changes_pending"
	mCommitFailed  = "weir_backend_commit_failures_total"
	mRSS           = "process_resident_memory_bytes"
	mGoroutines    = "go_goroutines"
	mPluginFailure = "weir_plugin_failures_total"
)

// scrape reads /metrics of the current process.
func (d *daemon) scrape(ctx context.Context) (metrics, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+metricsAddr+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	res, err := d.http.Do(req)
	if err != nil {
		return nil, err
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("/metrics: %s", res.Status)
	}
	return parseMetrics(res.Body)
}

// parseMetrics reads the Prometheus text format: "name{labels} value".
func parseMetrics(r io.Reader) (metrics, error) {
	m := metrics{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			continue
		}
		name := line[:i]
		if strings.Contains(name, `ip_family="IPv6"`) {
			continue // the same figure as IPv4's: one sync serves both
		}
		if j := strings.IndexByte(name, '{'); j >= 0 {
			name = name[:j]
		}
		m[name] += v
	}
	return m, sc.Err()
}

// timestamp turns a gauge of Unix seconds into a time.
func (m metrics) timestamp(name string) time.Time {
	v := m[name]
	if v == 0 {
		return time.Time{}
	}
	sec := int64(v)
	return time.Unix(sec, int64((v-float64(sec))*1e9))
}

// healthz returns the status code of /healthz.
func (d *daemon) healthz(ctx context.Context) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+healthzAddr+"/healthz", nil)
	if err != nil {
		return 0, err
	}
	res, err := d.http.Do(req)
	if err != nil {
		return 0, err
	}
	res.Body.Close()
	return res.StatusCode, nil
}

// tail returns the end of a log file, for a report.
func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(%v)", err)
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// errExited says weir run is not running.
var errExited = errors.New("weir run exited")
