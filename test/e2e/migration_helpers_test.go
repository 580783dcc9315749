//go:build e2e

package e2e

import (
	"bufio"
	"context"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/weirproxy/weir/test/netns"
)

// The client's traffic during a migration: bounded in rate, count and
// time, whatever happens to the test.
const (
	// migrationPace is the interval between two short connections; they
	// alternate between the cluster IP and the node port.
	migrationPace = 20 * time.Millisecond
	// migrationMaxConns and migrationMaxTime cap the short connections.
	migrationMaxConns = 6000
	migrationMaxTime  = 2 * time.Minute
	// migrationDial bounds one short connection: time for a lost SYN to
	// be sent again (after 1 s), which is then counted as slow.
	migrationDial = 3 * time.Second
	// migrationSlow is a connection that took long enough for its first
	// SYN to have been lost: a gap in the rules, even though TCP hid it.
	migrationSlow = 900 * time.Millisecond
	// migrationPing is how often the long-lived connection exchanges a
	// line.
	migrationPing = 100 * time.Millisecond
)

// migrationPhase counts the short connections of one phase.
type migrationPhase struct {
	name                 string
	made, failed, slow   int
	byPod                map[string]int
	examples             []string // the first few failures and slow ones
	exchangesAtPhaseEnds int      // the held connection's exchanges so far
}

// migrationTraffic is the client's traffic: short connections counted
// per phase, and one long-lived connection through the cluster IP.
type migrationTraffic struct {
	cancel context.CancelFunc
	done   chan struct{}

	mu        sync.Mutex
	phases    []*migrationPhase
	exchanges int   // lines the held connection echoed
	heldErr   error // why the held connection broke, if it did
}

// startMigrationTraffic opens the long-lived connection and starts both
// loops in phase "kube-proxy"; they stop when the test ends.
func startMigrationTraffic(t *testing.T, c *migrationCluster) *migrationTraffic {
	t.Helper()
	var conn net.Conn
	err := c.topo.Client.Do(func() (err error) {
		ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
		defer cancel()
		conn, err = (&net.Dialer{}).DialContext(ctx, "tcp", c.echoVIP.String())
		return err
	})
	if err != nil {
		t.Fatalf("open the long-lived connection to %s: %v", c.echoVIP, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), migrationMaxTime)
	tr := &migrationTraffic{cancel: cancel, done: make(chan struct{})}
	tr.setPhase("kube-proxy")
	var wg sync.WaitGroup
	wg.Go(func() { tr.hold(ctx, conn) })
	wg.Go(func() { tr.probe(ctx, c) })
	go func() {
		wg.Wait()
		close(tr.done)
	}()
	t.Cleanup(tr.stop)
	return tr
}

// stop ends both loops and waits for them.
func (tr *migrationTraffic) stop() {
	tr.cancel()
	<-tr.done
}

// setPhase starts counting the connections that begin from now on
// under name.
func (tr *migrationTraffic) setPhase(name string) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if n := len(tr.phases); n > 0 {
		tr.phases[n-1].exchangesAtPhaseEnds = tr.exchanges
	}
	tr.phases = append(tr.phases, &migrationPhase{name: name, byPod: map[string]int{}})
}

// probe opens a short connection every migrationPace, alternately to the
// cluster IP and the node port, until ctx ends or the cap is reached.
func (tr *migrationTraffic) probe(ctx context.Context, c *migrationCluster) {
	tick := time.NewTicker(migrationPace)
	defer tick.Stop()
	targets := []netip.AddrPort{c.vip, c.nodePort}
	for n := 0; n < migrationMaxConns; n++ {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		addr := targets[n%len(targets)]
		tr.mu.Lock()
		ph := tr.phases[len(tr.phases)-1]
		tr.mu.Unlock()
		start := time.Now()
		a, err := dial(c.topo.Client, addr, migrationDial)
		if ctx.Err() != nil {
			return // cut short by the end of the test, not by the rules
		}
		tr.record(ph, addr, a, err, time.Since(start))
	}
}

// record counts one short connection in the phase it started in.
func (tr *migrationTraffic) record(ph *migrationPhase, addr netip.AddrPort, a netns.Answer, err error, took time.Duration) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	ph.made++
	var bad string
	switch {
	case err != nil:
		ph.failed++
		bad = err.Error()
	case !slices.ContainsFunc(migrationPods, func(p netns.PodSpec) bool { return p.Name == a.Pod }):
		ph.failed++
		bad = "answered by " + a.String()
	case took >= migrationSlow:
		ph.slow++
		bad = fmt.Sprintf("took %v: its first SYN was lost", took.Round(time.Millisecond))
	default:
		ph.byPod[a.Pod]++
	}
	if bad != "" && len(ph.examples) < 5 {
		ph.examples = append(ph.examples, fmt.Sprintf("%s %s: %s", clock(time.Now()), addr, bad))
	}
}

// hold sends a line on conn every migrationPing and expects it back,
// until ctx ends or the connection breaks.
func (tr *migrationTraffic) hold(ctx context.Context, conn net.Conn) {
	defer conn.Close()
	r := bufio.NewReader(conn)
	tick := time.NewTicker(migrationPing)
	defer tick.Stop()
	for seq := 1; ; seq++ {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		if err := migrationExchange(conn, r, seq); err != nil {
			tr.mu.Lock()
			tr.heldErr = fmt.Errorf("%s: line %d: %w", clock(time.Now()), seq, err)
			tr.mu.Unlock()
			return
		}
		tr.mu.Lock()
		tr.exchanges++
		tr.mu.Unlock()
	}
}

// migrationExchange sends line seq on conn and reads it back within two seconds.
func migrationExchange(conn net.Conn, r *bufio.Reader, seq int) error {
	if err := conn.SetDeadline(time.Now().Add(2 * time.Second)); err != nil {
		return err
	}
	msg := fmt.Sprintf("line %d\n", seq)
	if _, err := conn.Write([]byte(msg)); err != nil {
		return err
	}
	got, err := r.ReadString('\n')
	if err == nil && got != msg {
		err = fmt.Errorf("echoed %q, want %q", got, msg)
	}
	return err
}

// waitConnections waits until the current phase, name, has made n short
// connections.
func (tr *migrationTraffic) waitConnections(t *testing.T, name string, n int) {
	t.Helper()
	poll(t, 30*time.Second, fmt.Sprintf("%d connections in phase %s", n, name), func() bool {
		tr.mu.Lock()
		defer tr.mu.Unlock()
		ph := tr.phases[len(tr.phases)-1]
		if ph.name != name {
			t.Fatalf("phase is %s, want %s", ph.name, name)
		}
		return ph.made >= n
	})
}

// waitExchange waits until the long-lived connection has echoed two more
// lines, and fails the test if it broke.
func (tr *migrationTraffic) waitExchange(t *testing.T, when string) {
	t.Helper()
	tr.mu.Lock()
	mark := tr.exchanges
	tr.mu.Unlock()
	poll(t, 10*time.Second, "the long-lived connection to echo "+when, func() bool {
		tr.mu.Lock()
		defer tr.mu.Unlock()
		if tr.heldErr != nil {
			t.Fatalf("the long-lived connection broke %s: %v", when, tr.heldErr)
		}
		return tr.exchanges >= mark+2
	})
}

// finish stops the traffic, logs each phase's figures and fails the test
// on any failed or slow connection.
func (tr *migrationTraffic) finish(t *testing.T) {
	t.Helper()
	tr.setPhase("end")
	tr.stop()
	tr.mu.Lock()
	defer tr.mu.Unlock()
	total := 0
	for _, ph := range tr.phases[:len(tr.phases)-1] {
		total += ph.made
		t.Logf("phase %-18s %4d connections, %d failed, %d slow; answered by %v; held connection at %d lines",
			ph.name+":", ph.made, ph.failed, ph.slow, ph.byPod, ph.exchangesAtPhaseEnds)
		if ph.failed+ph.slow > 0 {
			t.Errorf("phase %s: %d of %d short connections failed and %d were slow: %s",
				ph.name, ph.failed, ph.made, ph.slow, strings.Join(ph.examples, "; "))
		}
	}
	if tr.heldErr != nil {
		t.Errorf("the long-lived connection broke: %v", tr.heldErr)
	}
	t.Logf("%d short connections in all; the long-lived connection echoed %d lines", total, tr.exchanges)
}

// migrationRules is what the node's kernel holds of either proxy.
type migrationRules struct {
	// tables are the nftables tables, as "ip kube-proxy".
	tables []string
	// saves holds iptables-save's output per tool and flavour, as
	// "ip6tables-legacy".
	saves map[string]string
}

// readMigrationRules lists the node's nftables tables and saves both
// iptables flavours of both families.
func readMigrationRules(t *testing.T, node *netns.Namespace) migrationRules {
	t.Helper()
	r := migrationRules{saves: map[string]string{}}
	for _, line := range strings.Split(migrationRun(t, node, "nft", "list", "tables"), "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "table "); ok {
			r.tables = append(r.tables, rest)
		}
	}
	for _, tool := range []string{"iptables-nft", "ip6tables-nft", "iptables-legacy", "ip6tables-legacy"} {
		r.saves[tool] = migrationRun(t, node, tool+"-save")
	}
	return r
}

// migrationRun runs a command in node and returns its standard output.
func migrationRun(t *testing.T, node *netns.Namespace, name string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	out, err := node.Command(ctx, name, args...).Output()
	if err != nil {
		t.Fatalf("%s %s in %s: %v", name, strings.Join(args, " "), node.Name, err)
	}
	return string(out)
}

// migrationChain is one chain of an iptables save: where it is and its rules.
type migrationChain struct {
	where string // "iptables-nft nat"
	name  string
	rules []string
}

// chains returns every chain of every save.
func (r migrationRules) chains() []migrationChain {
	var out []migrationChain
	for _, tool := range slices.Sorted(maps.Keys(r.saves)) {
		var table string
		index := map[string]int{}
		for _, line := range strings.Split(r.saves[tool], "\n") {
			switch {
			case strings.HasPrefix(line, "*"):
				table, index = line[1:], map[string]int{}
			case strings.HasPrefix(line, ":"):
				name, _, _ := strings.Cut(line[1:], " ")
				index[name] = len(out)
				out = append(out, migrationChain{where: tool + " " + table, name: name})
			case strings.HasPrefix(line, "-A "):
				name, _, _ := strings.Cut(line[3:], " ")
				if i, ok := index[name]; ok {
					out[i].rules = append(out[i].rules, line)
				}
			}
		}
	}
	return out
}

// migrationKubeletChain is the chain no check counts as either proxy's:
// kubelet's firewall chain, which kube-proxy's iptables mode creates too
// and leaves, as its own cleanup does.
const migrationKubeletChain = "KUBE-FIREWALL"

// migrationWeirChains are the fixed chains of Weir's iptables mode, which
// carry kube-proxy's names, and the prefixes of its per-service chains.
var (
	migrationWeirChains      = []string{"KUBE-SERVICES", "KUBE-NODEPORTS", "KUBE-POSTROUTING", "KUBE-MARK-MASQ", "KUBE-EXTERNAL-SERVICES", "KUBE-FORWARD", "KUBE-PROXY-FIREWALL"}
	migrationServicePrefixes = []string{"KUBE-SVC-", "KUBE-SVL-", "KUBE-EXT-", "KUBE-FW-", "KUBE-SEP-"}
)

// migrationServiceChain says whether name is a per-service chain.
func migrationServiceChain(name string) bool {
	return slices.ContainsFunc(migrationServicePrefixes, func(p string) bool { return strings.HasPrefix(name, p) })
}

// kubeProxyLeft lists what kube-proxy left after the takeover in mode:
// its nftables tables; iptables chains of its names, except those Weir's
// iptables mode took over (only in mode iptables) and kubelet's, so
// including the empty canaries (KUBE-PROXY-CANARY) its iptables mode
// keeps in mangle, nat and filter; per-service chains no rule uses; and
// any rule of the Service migrationGoneAtTakeover, which only kube-proxy's
// rules knew.
func (r migrationRules) kubeProxyLeft(mode string) []string {
	var left []string
	for _, tb := range r.tables {
		if strings.HasSuffix(tb, " kube-proxy") {
			left = append(left, "table "+tb)
		}
	}
	chains := r.chains()
	for _, c := range chains {
		weirs := mode == "iptables" && (slices.Contains(migrationWeirChains, c.name) || migrationServiceChain(c.name))
		switch {
		case !strings.HasPrefix(c.name, "KUBE-"), c.name == migrationKubeletChain, weirs && migrationUsed(chains, c):
		default:
			left = append(left, c.where+" chain "+c.name)
		}
		left = append(left, c.rulesOf(migrationGoneAtTakeover)...)
	}
	return left
}

// rulesOf lists the chain's rules of the Service name, found by their
// comments, which both proxies write.
func (c migrationChain) rulesOf(name string) []string {
	var out []string
	for _, rule := range c.rules {
		if strings.Contains(rule, "default/"+name+":") {
			out = append(out, c.where+" rule "+rule)
		}
	}
	return out
}

// migrationUsed says whether c is a fixed chain or some rule of its table jumps to
// it.
func migrationUsed(chains []migrationChain, c migrationChain) bool {
	if !migrationServiceChain(c.name) {
		return true
	}
	for _, o := range chains {
		if o.where == c.where && slices.ContainsFunc(o.rules, func(r string) bool { return strings.HasSuffix(r, " -j "+c.name) }) {
			return true
		}
	}
	return false
}

// migrationCanary is the empty chain kube-proxy's iptables mode keeps in
// mangle, nat and filter to notice a flushed table.
const migrationCanary = "KUBE-PROXY-CANARY"

// canaries lists where kube-proxy's canary chains are, as "iptables-nft
// nat".
func (r migrationRules) canaries() []string {
	var out []string
	for _, c := range r.chains() {
		if c.name == migrationCanary {
			out = append(out, c.where)
		}
	}
	return out
}

// weirLeft lists what Weir left after the hand-back in mode: its nftables
// tables, chains named WEIR-*, any rule of the Service migrationGoneAtHandBack
// (deleted while Weir was stopped, so only Weir's rules could know it)
// and, in mode iptables, per-service chains no rule uses.
func (r migrationRules) weirLeft(mode string) []string {
	var left []string
	for _, tb := range r.tables {
		if strings.HasSuffix(tb, " weir") {
			left = append(left, "table "+tb)
		}
	}
	chains := r.chains()
	for _, c := range chains {
		switch {
		case strings.HasPrefix(c.name, "WEIR-"):
			left = append(left, c.where+" chain "+c.name)
		case mode == "iptables" && migrationServiceChain(c.name) && !migrationUsed(chains, c):
			left = append(left, c.where+" chain "+c.name+", used by no rule")
		}
		left = append(left, c.rulesOf(migrationGoneAtHandBack)...)
	}
	return left
}
