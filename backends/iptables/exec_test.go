package iptables

import (
	"errors"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/weirproxy/weir/backends/internal/xtables"
)

func TestSplitRule(t *testing.T) {
	for _, c := range []struct {
		in   string
		want []string
	}{
		{`INPUT -j KUBE-NODEPORTS`, []string{"INPUT", "-j", "KUBE-NODEPORTS"}},
		{`INPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes service portals" -j KUBE-SERVICES`,
			[]string{"INPUT", "-m", "conntrack", "--ctstate", "NEW", "-m", "comment", "--comment", "kubernetes service portals", "-j", "KUBE-SERVICES"}},
		{`X -m comment --comment "a \"b\" c\\d" -j Y`, []string{"X", "-m", "comment", "--comment", `a "b" c\d`, "-j", "Y"}},
		{`X -m comment --comment "" -j Y`, []string{"X", "-m", "comment", "--comment", "", "-j", "Y"}},
	} {
		if got := splitRule(c.in); !slices.Equal(got, c.want) {
			t.Errorf("splitRule(%s) = %q, want %q", c.in, got, c.want)
		}
	}
}

func TestOwnedChain(t *testing.T) {
	for _, c := range []string{"KUBE-SERVICES", "KUBE-SVC-ABCDEFGHIJKLMNOP", "KUBE-SEP-X", "KUBE-EXTERNAL-SERVICES", "KUBE-FORWARD", "KUBE-MARK-MASQ", "KUBE-XLB-OLDKUBEPROXY", "KUBE-POSTROUTING", "KUBE-NODEPORTS", "KUBE-PROXY-FIREWALL"} {
		if !ownedChain(c) {
			t.Errorf("ownedChain(%s) = false, want Weir's", c)
		}
	}
	for _, c := range []string{"KUBE-FIREWALL", "KUBE-MARK-DROP", "KUBE-KUBELET-CANARY", "KUBE-PROXY-CANARY", "INPUT", "DOCKER"} {
		if ownedChain(c) {
			t.Errorf("ownedChain(%s) = true, want someone else's", c)
		}
	}
}

func TestRestoreErrorQuotesTheFailingLine(t *testing.T) {
	text := []byte("*nat\n:KUBE-X - [0:0]\n-A KUBE-X -m bogus -j ACCEPT\nCOMMIT\n")
	for _, stderr := range []string{
		"iptables-restore v1.8.9 (legacy): Couldn't load match `bogus':No such file or directory\n\nError occurred at line: 3\nTry `iptables-restore -h' for more information.\n",
		"iptables-restore: line 3 failed\n",
	} {
		err := restoreError("/usr/sbin/iptables-legacy-restore", text, []byte(stderr), errors.New("exit status 2"))
		msg := err.Error()
		if !strings.Contains(msg, xtables.FirstLine([]byte(stderr))) || !strings.Contains(msg, `input line 3: "-A KUBE-X -m bogus -j ACCEPT"`) || !strings.Contains(msg, "table nat") {
			t.Errorf("error %q does not quote the complaint, the table and input line 3", msg)
		}
	}
	if msg := restoreError("r", text, nil, errors.New("signal: killed")).Error(); !strings.Contains(msg, "signal: killed") {
		t.Errorf("error without stderr %q does not carry the exit error", msg)
	}
}

func TestHasRules(t *testing.T) {
	for text, want := range map[string]bool{
		"":                              false,
		"*nat\nCOMMIT\n":                false,
		"# c\n*filter\n\nCOMMIT\n":      false,
		"*nat\n-A KUBE-X -j Y\nCOMMIT":  true,
		"*nat\n:KUBE-X - [0:0]\nCOMMIT": true,
	} {
		if got := hasRules([]byte(text)); got != want {
			t.Errorf("hasRules(%q) = %v, want %v", text, got, want)
		}
	}
}

func TestUnknownFlavour(t *testing.T) {
	if _, err := New(Options{Flavour: "iptables-ng"}); err == nil || !strings.Contains(err.Error(), "iptables-ng") {
		t.Errorf("New with an unknown flavour: %v, want an error naming it", err)
	}
}

func TestMissingBinariesAreNamed(t *testing.T) {
	saved := xtables.BinDirs
	t.Cleanup(func() { xtables.BinDirs = saved })
	xtables.BinDirs = []string{t.TempDir()}
	_, err := New(Options{Flavour: flavourLegacy})
	if err == nil {
		t.Fatal("New found the legacy binaries in an empty directory")
	}
	for _, bin := range []string{"iptables-legacy-restore", "ip6tables-legacy-save"} {
		if !strings.Contains(err.Error(), bin) {
			t.Errorf("error %q does not name the missing %s", err, bin)
		}
	}
	if _, err := New(Options{}); err == nil || !strings.Contains(err.Error(), "iptables-nft-restore") {
		t.Errorf("New with auto and no binaries: %v, want an error naming them", err)
	}
}

func TestListFirst(t *testing.T) {
	got := string(listFirst([]byte("*nat\n:KUBE-X - [0:0]\nCOMMIT\n")))
	if want := "*nat\n-S\n:KUBE-X - [0:0]\nCOMMIT\n"; got != want {
		t.Errorf("listFirst = %q, want %q", got, want)
	}
}

func TestWithoutList(t *testing.T) {
	text := []byte("*nat\n:KUBE-X - [0:0]\nCOMMIT\n")
	if got, ok := withoutList(listFirst(text)); !ok || string(got) != string(text) {
		t.Errorf("withoutList(listFirst(text)) = %q, %v; want the text back", got, ok)
	}
	if _, ok := withoutList(text); ok {
		t.Error("withoutList finds a listing in a text without one")
	}
}

func TestKilled(t *testing.T) {
	segv := exec.Command("sh", "-c", "kill -SEGV $$").Run()
	exit1 := exec.Command("sh", "-c", "exit 1").Run()
	if !killed(restoreError("r", nil, nil, segv)) {
		t.Errorf("a restore killed by SIGSEGV (%v) is not seen as killed", segv)
	}
	if killed(restoreError("r", nil, nil, exit1)) || killed(nil) {
		t.Error("a restore that exited, or succeeded, is seen as killed")
	}
}
