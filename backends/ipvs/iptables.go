package ipvs

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	goipt "github.com/coreos/go-iptables/iptables"
	"github.com/weirproxy/weir/internal/nsenter"
)

// The iptables flavours the rule layer can use.
const (
	FlavourNFT    = "nft"
	FlavourLegacy = "legacy"
)

// binDirs are where the iptables binaries are looked for, in order.
var binDirs = []string{"/usr/sbin", "/sbin", "/usr/local/sbin"}

// ruleTools are the binaries of one flavour for one family.
type ruleTools struct {
	family            int
	iptables, restore string
}

// chooseFlavour resolves Options.Flavour: as asked, or for "" and "auto"
// what `iptables --version` names ("nf_tables" or "legacy"), or nft when
// that says nothing and nft's binaries exist.
//
// This duplicates, in small, backends/iptables's detection, which is not
// exported (and decides from the rules present, as kube-proxy does).
func chooseFlavour(ctx context.Context, want string) (string, error) {
	switch want {
	case FlavourNFT, FlavourLegacy:
		return want, nil
	case "", "auto":
	default:
		return "", fmt.Errorf("ipvs: Options.Flavour %q: want auto, nft or legacy", want)
	}
	out, err := exec.CommandContext(ctx, "iptables", "--version").Output()
	switch {
	case err == nil && bytes.Contains(out, []byte("(legacy)")):
		return FlavourLegacy, nil
	case err == nil && bytes.Contains(out, []byte("(nf_tables)")):
		return FlavourNFT, nil
	case findBin("iptables-nft-restore") != "":
		return FlavourNFT, nil
	}
	return FlavourLegacy, nil
}

// flavourTools returns the binaries of flavour fl for IPv4 and IPv6; the
// error names every missing one.
func flavourTools(fl string) ([]ruleTools, error) {
	var out []ruleTools
	var missing []string
	for _, f := range []int{4, 6} {
		base := "iptables-" + fl
		if f == 6 {
			base = "ip6tables-" + fl
		}
		t := ruleTools{family: f, iptables: findBin(base), restore: findBin(base + "-restore")}
		for name, p := range map[string]string{base: t.iptables, base + "-restore": t.restore} {
			if p == "" {
				missing = append(missing, name)
			}
		}
		out = append(out, t)
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("ipvs: iptables flavour %s needs %s, not found in %s",
			fl, strings.Join(missing, ", "), strings.Join(binDirs, ", "))
	}
	return out, nil
}

func findBin(name string) string {
	for _, d := range binDirs {
		p := filepath.Join(d, name)
		if st, err := os.Stat(p); err == nil && !st.IsDir() && st.Mode()&0o111 != 0 {
			return p
		}
	}
	return ""
}

// inNetNS runs fn in the network namespace netNS (0: the caller's own),
// so that the processes it starts run there.
func inNetNS(netNS int, fn func() error) error {
	if netNS == 0 {
		return fn()
	}
	return nsenter.Do(netNS, fn)
}

// restore feeds text to t's iptables-restore in netNS, never flushing
// what text does not name and waiting for the xtables lock.
func restore(ctx context.Context, netNS int, t ruleTools, text []byte) error {
	var stderr bytes.Buffer
	err := inNetNS(netNS, func() error {
		cmd := exec.CommandContext(ctx, t.restore, "--noflush", "--wait")
		cmd.Stdin, cmd.Stderr = bytes.NewReader(text), &stderr
		return cmd.Run()
	})
	if err != nil {
		return fmt.Errorf("ipvs: %s: %w: %s", t.restore, err, strings.TrimSpace(stderr.String()))
	}
	return nil
}

func newIPTables(t ruleTools) (*goipt.IPTables, error) {
	proto := goipt.ProtocolIPv4
	if t.family == 6 {
		proto = goipt.ProtocolIPv6
	}
	ipt, err := goipt.New(goipt.IPFamily(proto), goipt.Path(t.iptables))
	if err != nil {
		return nil, fmt.Errorf("ipvs: %s: %w", t.iptables, err)
	}
	return ipt, nil
}

// ensureJumps adds the missing jump rules, each at the head of its
// built-in chain. The target chains must exist.
func ensureJumps(netNS int, ipt *goipt.IPTables) error {
	return inNetNS(netNS, func() error {
		for _, j := range jumps {
			ok, err := ipt.Exists("nat", j.from, j.spec()...)
			if err == nil && !ok {
				err = ipt.Insert("nat", j.from, 1, j.spec()...)
			}
			if err != nil {
				return fmt.Errorf("ipvs: add jump nat %s -> %s: %w", j.from, j.to, err)
			}
		}
		return nil
	})
}

// removeRules deletes the jumps and the layer's chains; missing ones are
// fine.
func removeRules(netNS int, ipt *goipt.IPTables) error {
	return inNetNS(netNS, func() error {
		for _, j := range jumps {
			if err := ipt.DeleteIfExists("nat", j.from, j.spec()...); err != nil {
				return fmt.Errorf("ipvs: delete jump nat %s -> %s: %w", j.from, j.to, err)
			}
		}
		for _, c := range natChains {
			ok, err := ipt.ChainExists("nat", c)
			if err == nil && ok {
				err = ipt.ClearAndDeleteChain("nat", c)
			}
			if err != nil {
				return fmt.Errorf("ipvs: delete chain nat %s: %w", c, err)
			}
		}
		return nil
	})
}
