//go:build vm

package ipvs

import (
	"context"
	"strings"
	"testing"

	"github.com/weirproxy/weir/backends"
	"github.com/weirproxy/weir/sdk/plan"
	"github.com/weirproxy/weir/test/conformance"
)

// TestConformance runs the shared kernel conformance table against this
// backend inside the VM of `make test-vm`, once per iptables flavour of
// its rule layer (go test -run 'TestConformance/nft/' picks one). After
// every sync the kernel is read back and compared with the plan.
func TestConformance(t *testing.T) {
	conformance.RunFlavours(t, []string{FlavourLegacy, FlavourNFT}, func(fl string) conformance.NewBackend {
		return func(t *testing.T, fd int, opts conformance.Options) backends.Backend {
			b, err := New(Options{Common: backends.Common{NetNS: fd, ClusterCIDRs: opts.ClusterCIDRs, MasqueradeAll: opts.MasqueradeAll}, Flavour: fl})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { b.Close() })
			return readBackChecked{b, t}
		}
	})
}

// readBackChecked is the backend under test: after each successful sync
// it reads the kernel back and fails the test on any divergence from the
// plan.
type readBackChecked struct {
	*Backend
	t *testing.T
}

// Sync syncs, then reads back and compares.
func (c readBackChecked) Sync(ctx context.Context, p *plan.Plan, changed []plan.Key) error {
	if err := c.Backend.Sync(ctx, p, changed); err != nil {
		return err
	}
	got, err := c.ReadBack(ctx)
	if err != nil {
		c.t.Errorf("read back after a sync: %v", err)
		return nil
	}
	want, owners := c.Expected(p)
	if d := backends.Compare(want, owners, got); len(d) > 0 {
		var lines []string
		for _, x := range d {
			lines = append(lines, x.String())
		}
		c.t.Errorf("after a sync (full %v) the kernel read back diverges from the plan:\n%s", changed == nil, strings.Join(lines, "\n"))
	}
	return nil
}
