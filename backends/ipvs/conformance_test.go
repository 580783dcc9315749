//go:build vm

package ipvs

import (
	"testing"

	"github.com/weirproxy/weir/backends"
	"github.com/weirproxy/weir/test/conformance"
)

// TestConformance runs the shared kernel conformance table against this
// backend inside the VM of `make test-vm`, once per iptables flavour of
// its rule layer (go test -run 'TestConformance/nft/' picks one). After
// every sync the kernel is read back and compared with the plan.
func TestConformance(t *testing.T) {
	conformance.RunFlavours(t, conformance.IPVS, []string{FlavourLegacy, FlavourNFT}, func(fl string) conformance.NewBackend {
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
