package conntrack

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/weirproxy/weir/test/netns"
)

func TestMaxFor(t *testing.T) {
	for _, tc := range []struct{ perCore, floor, cpus, want int }{
		{32768, 131072, 2, 131072}, // kube-proxy's defaults on a small node: the floor
		{32768, 131072, 8, 262144},
		{0, 131072, 8, 0}, // leave it alone
		{1000, 0, 4, 4000},
	} {
		if got := MaxFor(tc.perCore, tc.floor, tc.cpus); got != tc.want {
			t.Errorf("MaxFor(%d, %d, %d) = %d, want %d", tc.perCore, tc.floor, tc.cpus, got, tc.want)
		}
	}
}

func TestCountCPUs(t *testing.T) {
	for list, want := range map[string]int{"0": 1, "0-3": 4, "0-3,6,8-9": 7} {
		if n, ok := countCPUs(list); !ok || n != want {
			t.Errorf("countCPUs(%q) = %d, %v; want %d", list, n, ok, want)
		}
	}
	for _, bad := range []string{"", "x", "3-1", "0-"} {
		if _, ok := countCPUs(bad); ok {
			t.Errorf("countCPUs(%q) accepted", bad)
		}
	}
}

// TestKernelApplySysctls sets the timeouts in a network namespace of its
// own and reads them back; nf_conntrack_max, which only the initial
// namespace may set, fails with its name and leaves the hash table alone.
func TestKernelApplySysctls(t *testing.T) {
	ns := netns.NewT(t, netns.Options{}).Node
	hashsize := filepath.Join(t.TempDir(), "hashsize")
	if err := os.WriteFile(hashsize, []byte("1024\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	old := hashsizePath
	hashsizePath = hashsize
	t.Cleanup(func() { hashsizePath = old })
	errs := Apply(ns.Fd(), Settings{Max: 1 << 30, TCPEstablishedTimeout: 2 * time.Hour, TCPCloseWaitTimeout: 90 * time.Second,
		UDPTimeout: 45 * time.Second, UDPStreamTimeout: 150 * time.Second, TCPBeLiberal: true})
	if len(errs) != 1 || !strings.Contains(errs[0].Error(), "nf_conntrack_max") {
		t.Errorf("errors %v, want one naming nf_conntrack_max", errs)
	}
	for name, want := range map[string]string{
		"nf_conntrack_tcp_timeout_established": "7200",
		"nf_conntrack_tcp_timeout_close_wait":  "90",
		"nf_conntrack_udp_timeout":             "45",
		"nf_conntrack_udp_timeout_stream":      "150",
		"nf_conntrack_tcp_be_liberal":          "1",
	} {
		var got []byte
		err := ns.Do(func() (err error) {
			got, err = os.ReadFile("/proc/sys/net/netfilter/" + name)
			return err
		})
		if err != nil || strings.TrimSpace(string(got)) != want {
			t.Errorf("%s = %q, %v; want %s", name, got, err, want)
		}
	}
	if b, _ := os.ReadFile(hashsize); strings.TrimSpace(string(b)) != "1024" {
		t.Errorf("hashsize became %q although nf_conntrack_max was not set", b)
	}
}

// TestGrowHashTable grows the table only when it is smaller.
func TestGrowHashTable(t *testing.T) {
	hashsize := filepath.Join(t.TempDir(), "hashsize")
	old := hashsizePath
	hashsizePath = hashsize
	t.Cleanup(func() { hashsizePath = old })
	for _, tc := range []struct {
		cur, buckets int
		want         string
	}{{1024, 4096, "4096"}, {8192, 4096, "8192"}} {
		if err := os.WriteFile(hashsize, []byte(strconv.Itoa(tc.cur)+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := growHashTable(tc.buckets); err != nil {
			t.Fatal(err)
		}
		if b, _ := os.ReadFile(hashsize); strings.TrimSpace(string(b)) != tc.want {
			t.Errorf("from %d for %d buckets: %q, want %s", tc.cur, tc.buckets, b, tc.want)
		}
	}
}
