package iptables

import (
	"context"

	"github.com/weirproxy/weir/backends/internal/xtables"
)

// The iptables flavours (see package xtables).
const (
	flavourNFT    = xtables.NFT
	flavourLegacy = xtables.Legacy
)

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
	return flavourOf(xtables.Lookup(name))
}

// chooseFlavour resolves Options.Flavour: "nft" or "legacy" as asked, or
// for "auto" (or "") the flavour already in use in the namespace, decided
// from the rules each flavour holds (xtables.Choose).
func chooseFlavour(ctx context.Context, netNS int, want string) (*flavour, error) {
	return flavourOf(xtables.Choose(ctx, netNS, want))
}

// flavourOf converts a resolved xtables flavour, passing an error through.
func flavourOf(x *xtables.Flavour, err error) (*flavour, error) {
	if err != nil {
		return nil, err
	}
	toolsOf := func(t xtables.Tools) tools {
		return tools{iptables: t.Iptables, restore: t.Restore, save: t.Save}
	}
	return &flavour{name: x.Name, v4: toolsOf(x.V4), v6: toolsOf(x.V6)}, nil
}
