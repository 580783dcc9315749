// Package xtables finds the iptables binaries of a flavour (nft or legacy)
// and detects, as kube-proxy's iptables-wrapper does, which flavour a
// network namespace already uses. The iptables and IPVS backends share it.
// Its errors start with "iptables:", the tools they are about.
package xtables

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
	// NFT is iptables-nft: rules live in nf_tables tables ip/ip6 nat and
	// filter.
	NFT = "nft"
	// Legacy is iptables-legacy: the x_tables blobs, one per table,
	// replaced whole by every change under the xtables lock.
	Legacy = "legacy"
)

// BinDirs are where the flavours' binaries are looked for, in order.
// Tests point it at other directories.
var BinDirs = []string{"/usr/sbin", "/sbin", "/usr/local/sbin"}

// Tools are the binaries of one flavour for one IP family.
type Tools struct {
	// Iptables runs single commands.
	Iptables string
	// Restore and Save are the bulk tools.
	Restore, Save string
}

// Flavour is a resolved iptables flavour: its name and its binaries per
// IP family.
type Flavour struct {
	Name string
	V4   Tools
	V6   Tools
}

// FindBin returns the path of the executable name in the first of BinDirs
// holding one, or "" when none does.
func FindBin(name string) string {
	for _, d := range BinDirs {
		p := filepath.Join(d, name)
		if st, err := os.Stat(p); err == nil && !st.IsDir() && st.Mode()&0o111 != 0 {
			return p
		}
	}
	return ""
}

// Lookup resolves the binaries of flavour name for both IP families; the
// error names every one that is missing and the directories searched.
func Lookup(name string) (*Flavour, error) {
	var missing []string
	find := func(base string) string {
		p := FindBin(base)
		if p == "" {
			missing = append(missing, base)
		}
		return p
	}
	fl := &Flavour{Name: name}
	for _, f := range []struct {
		cmd string
		t   *Tools
	}{{"iptables", &fl.V4}, {"ip6tables", &fl.V6}} {
		prefix := f.cmd + "-" + name
		*f.t = Tools{Iptables: find(prefix), Restore: find(prefix + "-restore"), Save: find(prefix + "-save")}
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("iptables: flavour %q needs %s, not found (searched %s; install the iptables package with the %s binaries)",
			name, strings.Join(missing, ", "), strings.Join(BinDirs, ", "), name)
	}
	return fl, nil
}

// Choose resolves a flavour setting: NFT or Legacy as asked, or for "auto"
// (or "") the flavour whose rules the network namespace netNS (an open file
// descriptor; 0 is the caller's own) already holds, decided as kube-proxy's
// iptables-wrapper does. When only one flavour is installed, auto takes it
// without looking; when neither is, the error names what is missing.
func Choose(ctx context.Context, netNS int, want string) (*Flavour, error) {
	switch want {
	case NFT, Legacy:
		return Lookup(want)
	case "", "auto":
	default:
		return nil, fmt.Errorf("iptables: unknown flavour %q (want auto, nft or legacy)", want)
	}
	nft, nftErr := Lookup(NFT)
	legacy, legacyErr := Lookup(Legacy)
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

// detectLegacy says whether the existing rules of the network namespace
// netNS are legacy ones, deciding as kube-proxy's iptables-wrapper does:
// kubelet's hint chains (KUBE-IPTABLES-HINT, KUBE-KUBELET-CANARY) name the
// flavour kubelet chose; without them the flavour holding more rules wins,
// and nft wins a tie (including a namespace with no rules at all).
//
// The save runs list every table the flavour already has, for both
// families; a save that fails counts as no rules. A legacy save without -t
// does not instantiate tables that are not there yet. Legacy is surveyed
// first: when it holds neither a hint nor a rule, nft wins whatever it
// holds, and its save (0.3-0.5 s for Weir's own rules at 1k services, on
// every restart) is skipped.
func detectLegacy(ctx context.Context, netNS int, nft, legacy *Flavour) bool {
	legacyHint, legacyRules := survey(ctx, netNS, legacy)
	if !legacyHint && legacyRules == 0 {
		return false
	}
	nftHint, nftRules := survey(ctx, netNS, nft)
	switch {
	case nftHint:
		return false
	case legacyHint:
		return true
	}
	return legacyRules > nftRules
}

// survey runs the flavour's iptables-save and ip6tables-save and reports
// whether a hint chain is present and how many rules there are.
func survey(ctx context.Context, netNS int, fl *Flavour) (hint bool, rules int) {
	for _, t := range []Tools{fl.V4, fl.V6} {
		out, err := Save(ctx, netNS, t.Save, "")
		if err != nil {
			continue
		}
		h, n := CountRules(out)
		hint, rules = hint || h, rules+n
	}
	return hint, rules
}

// CountRules counts the rules ("-A" lines) in iptables-save output and
// reports whether kubelet's flavour hint chains are declared.
func CountRules(save []byte) (hint bool, rules int) {
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
