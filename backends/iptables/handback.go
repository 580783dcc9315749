package iptables

import (
	"context"

	"github.com/weirproxy/weir/backends"
)

var _ backends.HandBacker = (*Backend)(nil)

// HandBack removes nothing: Weir's iptables mode keeps nothing of its own
// in the kernel (see backends.HandBacker). Its chains and jump rules carry
// kube-proxy's names and specs, so kube-proxy's iptables mode took them
// over on its first sync: it rewrote every fixed chain and the
// per-service chains of its Services, found the jump rules identical to
// its own, and deleted the per-service chains it does not use. HandBack
// says so when the backend's flavour holds such chains; it looks only at
// tables the kernel has, and creates none.
func (b *Backend) HandBack(ctx context.Context) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	n, err := b.countOwned(ctx)
	switch {
	case err != nil:
		b.log.Warn("Left the iptables chains to kube-proxy without looking at them", "flavour", b.fl.name, "error", err)
	case n > 0:
		b.log.Info("Left the iptables chains to kube-proxy: Weir's carry kube-proxy's names, and its iptables mode took them over on its first sync",
			"flavour", b.fl.name, "chains", n)
	}
	return nil
}

// countOwned counts the chains with Weir's names in the nat and filter
// tables of both families.
func (b *Backend) countOwned(ctx context.Context) (int, error) {
	n := 0
	for _, fam := range b.fams {
		tables, err := b.presentTables(fam.f, []string{tableFilter, tableNAT})
		if err != nil {
			return 0, err
		}
		look, err := b.lookTables(ctx, fam.f, tables)
		if err != nil {
			return 0, err
		}
		for _, chains := range ownedIn(look) {
			n += len(chains)
		}
	}
	return n, nil
}
