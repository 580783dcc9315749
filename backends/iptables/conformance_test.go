package iptables

import (
	"context"
	"testing"

	"github.com/weirproxy/weir/backends"
	"github.com/weirproxy/weir/sdk/plan"
	"github.com/weirproxy/weir/test/conformance"
)

// TestConformance runs the shared kernel conformance table against this
// backend, once per iptables flavour (go test -run 'TestConformance/nft/'
// picks one). The rows of a flavour run in parallel, each in its own
// namespaces; legacy restores queue on the xtables lock. After every
// sync the rules are read back (ReadBack) and must do what the plan
// expects (Expected): the rows' plans exercise the read-back too.
func TestConformance(t *testing.T) {
	conformance.RunFlavours(t, conformance.IPTables, []string{flavourLegacy, flavourNFT}, func(fl string) conformance.NewBackend {
		return func(t *testing.T, fd int, opts conformance.Options) backends.Backend {
			b, err := New(Options{Common: backends.Common{NetNS: fd, ClusterCIDRs: opts.ClusterCIDRs, MasqueradeAll: opts.MasqueradeAll}, Flavour: fl})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { b.Close() })
			return conformance.CheckReadBack(t, b)
		}
	})
}

// ktDivergences reads b's rules back and compares them with what p
// expects.
func ktDivergences(t *testing.T, b *Backend, p *plan.Plan) []backends.Divergence {
	t.Helper()
	v, err := b.ReadBack(context.Background())
	if err != nil {
		t.Fatalf("read back: %v", err)
	}
	want, owners := b.Expected(p)
	return backends.Compare(want, owners, v)
}
