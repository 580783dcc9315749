package soak

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/google/nftables"

	"github.com/weirproxy/weir/test/netns"
)

// nftObject is a map or a chain of Weir's table.
type nftObject struct {
	kind string // "map" or "chain"
	name string
}

// nftObjects lists the maps and the regular chains (no base chains) of
// table weir of family ("ip" or "ip6") in ns, through netlink.
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

// checkListings runs the nft tool's three listings of the ruleset in the
// node, as an operator would, and records each that fails.
func (s *run) checkListings(ctx context.Context, round int, kind string) {
	for _, args := range [][]string{{"list", "ruleset"}, {"-j", "list", "ruleset"}, {"-t", "list", "ruleset"}} {
		lctx, cancel := context.WithTimeout(ctx, time.Minute)
		cmd := s.c.topo.Node.Command(lctx, "nft", args...)
		var stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = io.Discard, &stderr
		err := cmd.Run()
		cancel()
		s.rep.listings++
		if err != nil && ctx.Err() == nil {
			s.rep.listFailures = append(s.rep.listFailures, fmt.Sprintf("round %d, after %s: nft %s: %v: %s",
				round, kind, strings.Join(args, " "), err, lastLines(stderr.String(), 3)))
		}
	}
}
