package ipvs

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/vishvananda/netlink"
	"github.com/weirproxy/weir/backends"
)

var _ backends.HandBacker = (*Backend)(nil)

// HandBack removes what only Weir's IPVS mode has and leaves what
// kube-proxy's uses (see backends.HandBacker): it removes the masquerade
// layer's chains, in both iptables flavours, and its ipsets; then the
// firewall-mark virtual servers of the short circuit, which kube-proxy
// lacks and which no mark reaches once the layer is gone; then
// Options.Interface, unless it is named as kube-proxy's kube-ipvs0 or is
// no dummy interface. The virtual servers on addresses and ports stay:
// kube-proxy's IPVS mode keys its own the same way, takes over those of
// its Services and deletes the rest. Every step runs; HandBack logs what
// each removed and returns their errors.
func (b *Backend) HandBack(ctx context.Context) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return err
	}
	chains, sets, err := b.masq.cleanup(b.opts.NetNS)
	b.logRemoved("IPVS masquerade chains", chains)
	b.logRemoved("IPVS ipsets", sets)
	errs := []error{err}
	marked, err := b.deleteServers(func(k vsKey) bool { return inMarkRange(k.mark) })
	var names []string
	for _, k := range marked {
		names = append(names, k.String())
	}
	b.logRemoved("IPVS firewall-mark virtual servers", names)
	errs = append(errs, err)
	link, err := b.removeOwnLink()
	if link != "" {
		b.logRemoved("IPVS interface", []string{link})
	}
	b.reset()
	return errors.Join(append(errs, err)...)
}

// logRemoved logs what the hand-back removed of one kind, if anything.
func (b *Backend) logRemoved(what string, removed []string) {
	if len(removed) > 0 {
		b.log.Info("Removed Weir's own rules", "what", what, "removed", strings.Join(removed, ", "))
	}
}

// removeOwnLink deletes Options.Interface when it is Weir's: a dummy
// interface not named as kube-proxy's. It returns the name of the
// interface it deleted, "" when none.
func (b *Backend) removeOwnLink() (string, error) {
	name := b.opts.Interface
	if name == kubeProxyInterface {
		b.log.Warn("Leaving the IPVS interface alone: ipvs.interface is kube-proxy's interface name", "interface", name)
		return "", nil
	}
	link, err := b.nl.LinkByName(name)
	var notFound netlink.LinkNotFoundError
	switch {
	case errors.As(err, &notFound):
		return "", nil
	case err != nil:
		return "", fmt.Errorf("ipvs: find interface %s: %w", name, err)
	case link.Type() != "dummy":
		b.log.Warn("Leaving an interface named as ipvs.interface alone: it is no dummy interface, so not Weir's", "interface", name, "type", link.Type())
		return "", nil
	}
	if err := b.nl.LinkDel(link); err != nil {
		return "", fmt.Errorf("ipvs: delete interface %s: %w", name, err)
	}
	return name, nil
}
