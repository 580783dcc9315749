package ipvs

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	goipt "github.com/coreos/go-iptables/iptables"
	"github.com/weirproxy/weir/backends/internal/xtables"
)

// The iptables flavours the rule layer can use.
const (
	FlavourNFT    = xtables.NFT
	FlavourLegacy = xtables.Legacy
)

// ruleTools are the binaries of one flavour for one family.
type ruleTools struct {
	family                  int
	iptables, restore, save string
}

// chooseFlavour resolves Options.Flavour as backends/iptables does: as
// asked, or for "" and "auto" the flavour whose rules the network
// namespace netNS already holds (see xtables.Choose).
func chooseFlavour(ctx context.Context, netNS int, want string) (string, error) {
	fl, err := xtables.Choose(ctx, netNS, want)
	if err != nil {
		return "", fmt.Errorf("ipvs: Options.Flavour %q: %w", want, err)
	}
	return fl.Name, nil
}

// flavourTools returns the binaries of flavour fl for IPv4 and IPv6; the
// error names every missing one.
func flavourTools(fl string) ([]ruleTools, error) {
	x, err := xtables.Lookup(fl)
	if err != nil {
		return nil, fmt.Errorf("ipvs: %w", err)
	}
	return []ruleTools{
		{family: 4, iptables: x.V4.Iptables, restore: x.V4.Restore, save: x.V4.Save},
		{family: 6, iptables: x.V6.Iptables, restore: x.V6.Restore, save: x.V6.Save},
	}, nil
}

// restore feeds text to t's iptables-restore in netNS, never flushing
// what text does not name and waiting at most xtables.LockWait for the
// xtables lock (a *xtables.LockError when another process held it).
func restore(ctx context.Context, netNS int, t ruleTools, text []byte) error {
	stderr, err := xtables.Run(ctx, netNS, text, io.Discard, t.restore, append([]string{"--noflush"}, xtables.WaitArgs()...)...)
	if lerr := xtables.CheckLock(t.restore, stderr, err); lerr != nil {
		return fmt.Errorf("ipvs: %w", lerr)
	}
	if err != nil {
		return fmt.Errorf("ipvs: %s: %w: %s", t.restore, err, strings.TrimSpace(string(stderr)))
	}
	return nil
}

// newIPTables returns go-iptables for t's family and binary, waiting at
// most xtables.LockWait for the xtables lock.
func newIPTables(t ruleTools) (*goipt.IPTables, error) {
	proto := goipt.ProtocolIPv4
	if t.family == 6 {
		proto = goipt.ProtocolIPv6
	}
	ipt, err := goipt.New(goipt.IPFamily(proto), goipt.Path(t.iptables), goipt.Timeout(int(xtables.LockWait/time.Second)))
	if err != nil {
		return nil, fmt.Errorf("ipvs: %s: %w", t.iptables, err)
	}
	return ipt, nil
}

// ensureJumps adds the missing jump rules, each at the head of its
// built-in chain, with tool (ipt's binary). The target chains must exist.
func ensureJumps(netNS int, ipt *goipt.IPTables, tool string) error {
	return xtables.InNetNS(netNS, func() error {
		for _, j := range jumps {
			ok, err := ipt.Exists(j.table, j.from, j.spec()...)
			if err == nil && !ok {
				err = ipt.Insert(j.table, j.from, 1, j.spec()...)
			}
			if lerr := xtables.CheckLock(tool, nil, err); lerr != nil {
				return fmt.Errorf("ipvs: add jump %s %s -> %s: %w", j.table, j.from, j.to, lerr)
			}
			if err != nil {
				return fmt.Errorf("ipvs: add jump %s %s -> %s: %w", j.table, j.from, j.to, err)
			}
		}
		return nil
	})
}

// removeRules deletes the jumps and the layer's chains, and returns the
// chains it deleted as "table chain"; missing ones are fine.
func removeRules(netNS int, ipt *goipt.IPTables) (removed []string, err error) {
	err = xtables.InNetNS(netNS, func() error {
		for _, j := range jumps {
			// Without its target chain there is no jump, and iptables
			// cannot even check for one.
			ok, err := ipt.ChainExists(j.table, j.to)
			if err == nil && ok {
				err = ipt.DeleteIfExists(j.table, j.from, j.spec()...)
			}
			if err != nil {
				return fmt.Errorf("ipvs: delete jump %s %s -> %s: %w", j.table, j.from, j.to, err)
			}
		}
		for _, t := range layerChains {
			for _, c := range t.chains {
				ok, err := ipt.ChainExists(t.table, c)
				if err == nil && ok {
					err = ipt.ClearAndDeleteChain(t.table, c)
				}
				if err != nil {
					return fmt.Errorf("ipvs: delete chain %s %s: %w", t.table, c, err)
				}
				if ok {
					removed = append(removed, t.table+" "+c)
				}
			}
		}
		return nil
	})
	return removed, err
}
