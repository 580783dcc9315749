package nftables

import (
	"context"
	"sync"
	"testing"

	"github.com/weirproxy/weir/backends"
	"github.com/weirproxy/weir/sdk/plan"
	"github.com/weirproxy/weir/test/conformance"
)

// TestConformance runs the shared kernel conformance table against this
// backend, reading the kernel back after every sync.
func TestConformance(t *testing.T) {
	conformance.Run(t, conformance.NFTables, func(t *testing.T, fd int, opts conformance.Options) backends.Backend {
		b, err := New(Options{Common: backends.Common{NetNS: fd, ClusterCIDRs: opts.ClusterCIDRs, MasqueradeAll: opts.MasqueradeAll}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { b.Close() })
		return conformance.CheckReadBack(t, serialized{b, t})
	})
}

// setIDs serialises the transactions of the backends of the table's parallel
// rows. google/nftables v0.3.0 numbers the sets of a transaction from a
// package-level counter that every Conn increments without synchronisation
// (fixed upstream by a Conn-scoped counter, google/nftables#307, after
// v0.3.0): two Conns adding sets at once are a data race, which -race
// reports. A Weir process has one backend, so only tests meet it.
var setIDs sync.Mutex

// serialized is a backend whose calls hold setIDs; after every sync the nft
// tool must list the tables.
type serialized struct {
	*Backend
	t *testing.T
}

func (s serialized) Sync(ctx context.Context, p *plan.Plan, req backends.SyncRequest) error {
	setIDs.Lock()
	err := s.Backend.Sync(ctx, p, req)
	setIDs.Unlock()
	if err == nil {
		nftLists(s.t, s.Backend)
	}
	return err
}

func (s serialized) Cleanup(ctx context.Context) error {
	setIDs.Lock()
	defer setIDs.Unlock()
	return s.Backend.Cleanup(ctx)
}
