package iptables

import (
	"context"
	"errors"
	"slices"

	"github.com/weirproxy/weir/backends/internal/xtables"
)

// Installed says whether the node has the binaries of the iptables flavour
// name, "nft" or "legacy", for both families.
func Installed(name string) bool {
	_, err := xtables.Lookup(name)
	return err == nil
}

// RemoveKubeProxy removes, in the backend's flavour, the chains kube-proxy's
// IPVS mode left that Weir's layout does not have, and the rules jumping
// into them. The chains kube-proxy's iptables mode used carry Weir's names:
// Weir's first full sync took them over. For the other flavour, kube-proxy's
// chains are all leftovers: Cleanup removes them.
//
// Such chains may jump into Weir's (KUBE-MARK-MASQ), which makes the look
// at the tables right after Weir's first rewrite differ from what Weir
// wrote: once they are gone, the look is trusted again.
func (b *Backend) RemoveKubeProxy(ctx context.Context) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	var errs []error
	removed := 0
	for _, fam := range b.fams {
		for _, table := range []string{tableFilter, tableNAT} {
			removable := func(c string) bool { return slices.Contains(kubeProxyIPVSChains[table], c) }
			n, err := cleanupTable(ctx, b.opts.NetNS, fam.ipt, fam.tools, table, removable)
			removed += n
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
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
