package nftables

import (
	"context"
	"fmt"

	"github.com/google/nftables"
)

// kubeProxyTable is the table kube-proxy's nftables mode keeps in both
// families (ip and ip6 kube-proxy).
const kubeProxyTable = "kube-proxy"

// RemoveKubeProxy deletes kube-proxy's tables, ip and ip6 kube-proxy, in one
// transaction, as kube-proxy's own cleanup does; Weir's tables stay. It is
// not an error when there are none.
func (b *Backend) RemoveKubeProxy(ctx context.Context) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	t := b.kubeProxyTxns()
	if len(t) == 0 {
		return nil
	}
	// A commit of kube-proxy's tables alone keeps the generation stamp of
	// Weir's trusted: the next periodic sync need not refill.
	if err := b.commit(false, t...); err != nil {
		return fmt.Errorf("remove kube-proxy's tables: %w", err)
	}
	return nil
}

// kubeProxyTxns returns the transactions that delete kube-proxy's tables;
// none when Weir is configured to use that table name itself.
func (b *Backend) kubeProxyTxns() []*txn {
	if b.opts.Table == kubeProxyTable {
		return nil
	}
	var t []*txn
	for _, f := range []nftables.TableFamily{nftables.TableFamilyIPv4, nftables.TableFamilyIPv6} {
		t = append(t, dropTable(&nftables.Table{Name: kubeProxyTable, Family: f}))
	}
	return t
}
