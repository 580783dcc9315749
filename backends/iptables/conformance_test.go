package iptables

import (
	"testing"

	"github.com/weirproxy/weir/backends"
	"github.com/weirproxy/weir/test/conformance"
)

// TestConformance runs the shared kernel conformance table against this
// backend, once per iptables flavour (go test -run 'TestConformance/nft/'
// picks one). The rows of a flavour run in parallel, each in its own
// namespaces; legacy restores queue on the xtables lock (--wait).
func TestConformance(t *testing.T) {
	conformance.RunFlavours(t, []string{flavourLegacy, flavourNFT}, func(fl string) conformance.NewBackend {
		return func(t *testing.T, fd int, opts conformance.Options) backends.Backend {
			b, err := New(Options{Common: backends.Common{NetNS: fd, ClusterCIDRs: opts.ClusterCIDRs, MasqueradeAll: opts.MasqueradeAll}, Flavour: fl})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { b.Close() })
			return b
		}
	})
}
