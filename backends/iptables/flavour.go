package iptables

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// The iptables flavours: the same commands over two kernel interfaces.
const (
	// flavourNFT is iptables-nft: rules live in nf_tables tables ip/ip6
	// nat and filter.
	flavourNFT = "nft"
	// flavourLegacy is iptables-legacy: the x_tables blobs, one per table,
	// replaced whole by every change under the xtables lock.
	flavourLegacy = "legacy"
)

// binDirs are where the flavours' binaries are looked for, in order.
var binDirs = []string{"/usr/sbin", "/sbin", "/usr/local/sbin"}

// tools are the binaries of one flavour for one IP family.
type tools struct {
	// iptables runs single commands (through go-iptables).
	iptables string
	// restore and save are the bulk tools.
	restore, save string
}

// flavour is a resolved iptables flavour: its name and its binaries per
// family.
type flavour struct {
	name string
	v4   tools
	v6   tools
}

// tools returns the flavour's binaries for family f.
func (fl *flavour) tools(f ipFamily) tools {
	if f == ipv6 {
		return fl.v6
	}
	return fl.v4
}

// lookupFlavour resolves the binaries of flavour name; the error names
// every one that is missing.
func lookupFlavour(name string) (*flavour, error) {
	var missing []string
	find := func(base string) string {
		for _, d := range binDirs {
			p := filepath.Join(d, base)
			if st, err := os.Stat(p); err == nil && !st.IsDir() && st.Mode()&0o111 != 0 {
				return p
			}
		}
		missing = append(missing, filepath.Join(binDirs[0], base))
		return ""
	}
	fl := &flavour{name: name}
	for _, f := range []struct {
		cmd string
		t   *tools
	}{{"iptables", &fl.v4}, {"ip6tables", &fl.v6}} {
		prefix := f.cmd + "-" + name
		*f.t = tools{iptables: find(prefix), restore: find(prefix + "-restore"), save: find(prefix + "-save")}
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("iptables: flavour %q needs %s, not found (searched %s; install the iptables package with the %s binaries)",
			name, strings.Join(missing, ", "), strings.Join(binDirs, ", "), name)
	}
	return fl, nil
}

// chooseFlavour resolves Options.Flavour: "nft" or "legacy" as asked, or
// for "auto" (or "") the flavour already in use in the namespace.
func chooseFlavour(ctx context.Context, netNS int, want string) (*flavour, error) {
	switch want {
	case flavourNFT, flavourLegacy:
		return lookupFlavour(want)
	case "", "auto":
	default:
		return nil, fmt.Errorf("iptables: unknown flavour %q (want auto, nft or legacy)", want)
	}
	nft, nftErr := lookupFlavour(flavourNFT)
	legacy, legacyErr := lookupFlavour(flavourLegacy)
	switch {
	case nftErr != nil && legacyErr != nil:
		return nil, errors.Join(nftErr, legacyErr)
	case legacyErr != nil:
		return nft, nil
	case nftErr != nil:
		return legacy, nil
	}
	if detectLegacy(ctx, netNS, nft, legacy) {
		return legacy, nil
	}
	return nft, nil
}

// detectLegacy says whether the namespace's existing rules are legacy ones,
// deciding as kube-proxy's iptables-wrapper does: kubelet's hint chains
// (KUBE-IPTABLES-HINT, KUBE-KUBELET-CANARY) name the flavour kubelet chose;
// without them the flavour holding more rules wins, and nft wins a tie
// (including a namespace with no rules at all).
//
// The save runs list every table the flavour already has, for both
// families; a save that fails counts as no rules. A legacy save without -t
// does not instantiate tables that are not there yet.
func detectLegacy(ctx context.Context, netNS int, nft, legacy *flavour) bool {
	nftHint, nftRules := surveyFlavour(ctx, netNS, nft)
	legacyHint, legacyRules := surveyFlavour(ctx, netNS, legacy)
	switch {
	case nftHint:
		return false
	case legacyHint:
		return true
	}
	return legacyRules > nftRules
}

// surveyFlavour runs the flavour's iptables-save and ip6tables-save and
// reports whether a hint chain is present and how many rules there are.
func surveyFlavour(ctx context.Context, netNS int, fl *flavour) (hint bool, rules int) {
	for _, f := range []ipFamily{ipv4, ipv6} {
		out, err := runSave(ctx, netNS, fl.tools(f).save, "")
		if err != nil {
			continue
		}
		h, n := countRules(out)
		hint, rules = hint || h, rules+n
	}
	return hint, rules
}

// countRules counts the rules ("-A" lines) in iptables-save output and
// reports whether kubelet's flavour hint chains are declared.
func countRules(save []byte) (hint bool, rules int) {
	for line := range bytes.Lines(save) {
		switch {
		case bytes.HasPrefix(line, []byte("-A ")):
			rules++
		case bytes.HasPrefix(line, []byte(":KUBE-IPTABLES-HINT ")), bytes.HasPrefix(line, []byte(":KUBE-KUBELET-CANARY ")):
			hint = true
		}
	}
	return hint, rules
}
