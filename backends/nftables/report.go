package nftables

import (
	"github.com/google/nftables"

	"github.com/weirproxy/weir/backends"
)

var _ backends.Reporter = (*Backend)(nil)

// Report returns the figures of the latest Sync; see backends.Reporter.
// Failed counts, in each family, the transactions carrying its table that
// failed (one netlink batch carries the tables it changes, so a failure
// counts in each of them), also those Sync then made up for by rebuilding
// the tables; FailedPartial those of them that sent only the changes. The
// backend counts no rules.
func (b *Backend) Report() backends.Report {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.report
}

// failures counts, per table (IPv4, IPv6), the commits of the Sync under
// way that failed, and those of them that were partial.
type failures struct {
	failed, partial [2]int
}

// refused counts a failed commit of txns; full says it wrote every object.
func (f *failures) refused(full bool, txns []*txn) {
	for _, t := range txns {
		i := 0
		if t.table.Family == nftables.TableFamilyIPv6 {
			i = 1
		}
		f.failed[i]++
		if !full {
			f.partial[i]++
		}
	}
}

// report returns the figures of the Sync that just ended.
func (f *failures) report() backends.Report {
	return backends.Report{Families: []backends.FamilyReport{
		{Family: backends.IPv4, Failed: f.failed[0], FailedPartial: f.partial[0]},
		{Family: backends.IPv6, Failed: f.failed[1], FailedPartial: f.partial[1]},
	}}
}
