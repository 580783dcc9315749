package iptables

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"slices"
	"strings"

	"github.com/weirproxy/weir/backends/internal/xtables"
)

// kubeProxyCanary is the empty chain kube-proxy's iptables mode keeps in
// the mangle, nat and filter tables of both families, to notice when
// something flushes them (pkg/util/iptables, Monitor). It outlives
// kube-proxy; kube-proxy --cleanup deletes it.
const kubeProxyCanary = "KUBE-PROXY-CANARY"

// tableMangle holds nothing of Weir's iptables mode: only kube-proxy's
// canary is removed from it.
const tableMangle = "mangle"

// removalTables are the tables Cleanup and RemoveKubeProxy remove chains
// from.
var removalTables = []string{tableFilter, tableNAT, tableMangle}

// Installed says whether the node has the binaries of the iptables flavour
// name, "nft" or "legacy", for both families.
func Installed(name string) bool {
	_, err := xtables.Lookup(name)
	return err == nil
}

// kubeProxyLeftover says whether chain, in table, is one that kube-proxy
// leaves and Weir's layout does not have: a chain of kube-proxy's IPVS
// mode, or its canary.
func kubeProxyLeftover(table, chain string) bool {
	return chain == kubeProxyCanary || slices.Contains(kubeProxyIPVSChains[table], chain)
}

// RemoveKubeProxy removes, in the backend's flavour, the chains kube-proxy
// left that Weir's layout does not have, and the rules jumping into them:
// its IPVS mode's chains and its canaries. The chains kube-proxy's
// iptables mode used carry Weir's names: Weir's first full sync took them
// over. For the other flavour, kube-proxy's chains are all leftovers:
// Cleanup removes them.
//
// Chains of the IPVS mode may jump into Weir's (KUBE-MARK-MASQ), which
// makes the look at the tables right after Weir's first rewrite differ
// from what Weir wrote: once they are gone, the look is trusted again.
func (b *Backend) RemoveKubeProxy(ctx context.Context) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	removed, err := b.removeChains(ctx, kubeProxyLeftover)
	if err != nil {
		return err
	}
	if removed > 0 && b.lookBroken.CompareAndSwap(true, false) {
		for _, fam := range b.fams {
			fam.verified = false
		}
		b.log.Info("With kube-proxy's chains gone, Weir checks its iptables rules cheaply again", "flavour", b.fl.name, "chains", removed)
	}
	return nil
}

// removeChains removes, in the removalTables of both families that the
// kernel has, the chains removable names and the rules of other chains
// jumping into them (see cleanupTable). It goes on after an error, and
// returns how many chains it removed.
func (b *Backend) removeChains(ctx context.Context, removable func(table, chain string) bool) (int, error) {
	var errs []error
	removed := 0
	for _, fam := range b.fams {
		tables, err := b.presentTables(fam.f, removalTables)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, table := range tables {
			n, err := cleanupTable(ctx, b.opts.NetNS, fam.ipt, fam.tools, table, func(c string) bool { return removable(table, c) })
			removed += n
			errs = append(errs, err)
		}
	}
	return removed, errors.Join(errs...)
}

// legacyTableNames list, per family, the iptables-legacy tables the
// network namespace has.
var legacyTableNames = map[ipFamily]string{ipv4: "ip_tables_names", ipv6: "ip6_tables_names"}

// presentTables returns those of tables that family f's kernel has. An
// iptables-legacy tool asked only to read a table creates it in the
// namespace (an empty legacy mangle table, say, after which every
// iptables-nft run warns of legacy tables), so for legacy the tables are
// read from /proc first; iptables-nft's tools create none.
func (b *Backend) presentTables(f ipFamily, tables []string) ([]string, error) {
	if b.fl.name == flavourNFT {
		return tables, nil
	}
	var names []byte
	err := inNetNS(b.opts.NetNS, func() (err error) {
		names, err = os.ReadFile("/proc/thread-self/net/" + legacyTableNames[f])
		return err
	})
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil // no x_tables for the family: no table at all
	}
	if err != nil {
		return nil, fmt.Errorf("iptables: list the IPv%d legacy tables: %w", f, err)
	}
	have := strings.Fields(string(names))
	return slices.DeleteFunc(slices.Clone(tables), func(t string) bool { return !slices.Contains(have, t) }), nil
}
