package soak

import (
	"fmt"

	"github.com/google/nftables"

	"github.com/weirproxy/weir/test/netns"
)

// nftObject is a map or a chain of Weir's table.
type nftObject struct {
	kind string // "map" or "chain"
	name string
}

// nftObjects lists the maps and the regular chains (no base chains) of
// table weir of family ("ip" or "ip6") in ns, through netlink: this nft
// binary cannot print Weir's concatenated maps.
func nftObjects(ns *netns.Namespace, family string) ([]nftObject, error) {
	conn, err := nftables.New(nftables.WithNetNSFd(ns.Fd()))
	if err != nil {
		return nil, err
	}
	fam := nftables.TableFamilyIPv4
	if family == "ip6" {
		fam = nftables.TableFamilyIPv6
	}
	table := &nftables.Table{Name: "weir", Family: fam}
	sets, err := conn.GetSets(table)
	if err != nil {
		return nil, fmt.Errorf("list the maps of %s weir: %w", family, err)
	}
	var out []nftObject
	for _, s := range sets {
		if s.IsMap && !s.Anonymous {
			out = append(out, nftObject{"map", s.Name})
		}
	}
	chains, err := conn.ListChainsOfTableFamily(fam)
	if err != nil {
		return nil, fmt.Errorf("list the chains of %s weir: %w", family, err)
	}
	for _, c := range chains {
		if c.Table.Name == "weir" && c.Hooknum == nil {
			out = append(out, nftObject{"chain", c.Name})
		}
	}
	return out, nil
}
