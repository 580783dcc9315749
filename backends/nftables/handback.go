package nftables

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/google/nftables"
	"github.com/weirproxy/weir/backends"
)

var _ backends.HandBacker = (*Backend)(nil)

// HandBack deletes Weir's tables, ip and ip6 Options.Table, in one
// transaction and leaves kube-proxy's, which serve once kube-proxy has
// synced (see backends.HandBacker); it logs the tables it deleted. With
// Options.Table set to kube-proxy's table name it deletes nothing.
func (b *Backend) HandBack(ctx context.Context) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.opts.Table == kubeProxyTable {
		b.log.Warn("Leaving the nftables tables alone: nftables.table is kube-proxy's table name", "table", b.opts.Table)
		return nil
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	present, err := b.presentTables()
	if err != nil || len(present) == 0 {
		return err
	}
	var txns []*txn
	var names []string
	for _, tb := range present {
		txns = append(txns, dropTable(tb.layout.table))
		names = append(names, tb.layout.fam.kw+" "+b.opts.Table)
	}
	if err := b.commit(true, txns...); err != nil {
		return fmt.Errorf("remove Weir's tables: %w", err)
	}
	for _, tb := range b.tables {
		tb.state, tb.synced = newState(), false
	}
	b.log.Info("Removed Weir's own rules", "what", "nftables tables", "removed", strings.Join(names, ", "))
	return nil
}

// presentTables returns the backend's tables that the kernel holds,
// listed on sockets of their own.
func (b *Backend) presentTables() ([]*table, error) {
	var opts []nftables.ConnOption
	if b.opts.NetNS != 0 {
		opts = append(opts, nftables.WithNetNSFd(b.opts.NetNS))
	}
	conn, err := nftables.New(opts...)
	if err != nil {
		return nil, fmt.Errorf("nftables: open netlink socket: %w", err)
	}
	var out []*table
	for _, tb := range b.tables {
		list, err := conn.ListTablesOfFamily(tb.layout.table.Family)
		if err != nil {
			return nil, fmt.Errorf("nftables: list the %s tables: %w", tb.layout.fam.kw, err)
		}
		if slices.ContainsFunc(list, func(t *nftables.Table) bool { return t.Name == b.opts.Table }) {
			out = append(out, tb)
		}
	}
	return out, nil
}

// dropTable returns the transaction that deletes table. Adding a table
// that exists changes nothing, so the delete that follows never fails for
// want of one.
func dropTable(table *nftables.Table) *txn {
	return &txn{table: table, ops: []op{{kind: opAddTable}, {kind: opDelTable}}}
}
