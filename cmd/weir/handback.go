package main

import (
	"context"

	"github.com/spf13/pflag"

	"github.com/weirproxy/weir/backends"
)

// The hand-back to kube-proxy, `weir cleanup --keep-kube-proxy`: Weir has
// stopped (its rules still serve), kube-proxy has started and synced, and
// both rule sets serve side by side. For each mode (and iptables flavour)
// a backend removes what is Weir's alone and leaves everything kube-proxy
// uses, or names as kube-proxy names it (backends.HandBacker):
//
//   - nftables: Weir's tables (ip and ip6 nftables.table); kube-proxy's
//     tables, ip and ip6 kube-proxy, stay.
//   - iptables: nothing. Weir's chains and jump rules carry kube-proxy's
//     names and specs, so kube-proxy's iptables mode took them over on its
//     first sync.
//   - ipvs: Weir's masquerade layer (its chains, in both iptables
//     flavours, and its ipsets), the firewall-mark virtual servers of its
//     short circuit and Weir's dummy interface. The other virtual servers
//     stay: they are keyed by address and port as kube-proxy's IPVS mode
//     keys its own, which takes over those of its services and deletes
//     the rest.
//
// Run after kube-proxy's first sync, in the mode (and iptables flavour)
// Weir ran in, the hand-back opens no gap: until that sync Weir's rules
// serve, and afterwards kube-proxy's. test/e2e's TestMigration proves it
// against the real kube-proxy.

// keepKubeProxyFlag names the flag of the hand-back.
const keepKubeProxyFlag = "keep-kube-proxy"

// cleanupFlags adds the cleanup command's own flag.
func cleanupFlags(fs *pflag.FlagSet) {
	fs.Bool(keepKubeProxyFlag, false,
		"remove only Weir's own state and leave kube-proxy's: the hand-back to kube-proxy, run once kube-proxy has synced (see docs/operations.md)")
}

// handBackTarget hands one mode, with one iptables flavour when the mode
// has any, back to kube-proxy, whatever env's mode is: a backend of it
// removes Weir's own state, when it has any to remove (see the top of this
// file). The backends log what they removed.
func handBackTarget(env *environment, mode, flavour string) error {
	be, err := newBackend(envFor(env, mode, flavour))
	if err != nil {
		return err
	}
	defer be.Close()
	if h, ok := be.(backends.HandBacker); ok {
		return h.HandBack(context.Background())
	}
	return nil
}
