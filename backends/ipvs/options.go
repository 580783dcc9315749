package ipvs

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/weirproxy/weir/backends"
)

// Defaults for the zero fields of Options.
const (
	// DefaultScheduler is the IPVS scheduler used when neither Options nor
	// the plan names one: round robin.
	DefaultScheduler = "rr"
	// DefaultInterface is the dummy interface that holds the service
	// addresses.
	DefaultInterface = "weir-ipvs0"
	// DefaultGracePeriod is the longest a removed real server keeps its
	// established connections before it is deleted anyway: long enough for
	// ordinary requests and pod shutdowns, short enough that one idle
	// long-lived connection does not pin a gone pod's real server for
	// hours. (kube-proxy has no such bound: it waits for the counts.)
	DefaultGracePeriod = 15 * time.Minute
)

// Schedulers lists the IPVS schedulers the backend accepts, by their
// kernel names (each is the module ip_vs_<name>).
var Schedulers = []string{"rr", "wrr", "lc", "wlc", "sh", "dh", "sed", "nq", "mh"}

// Options configures the IPVS backend.
type Options struct {
	backends.Common
	// Scheduler balances services whose plan gives no scheduler hint;
	// DefaultScheduler when empty. It must be one of Schedulers.
	Scheduler string
	// Interface names the dummy interface holding every cluster, external
	// and load-balancer IP; DefaultInterface when empty.
	Interface string
	// StrictARP stops the node answering ARP for the service addresses on
	// Interface (arp_ignore=1, arp_announce=2), as MetalLB and kube-vip
	// need.
	StrictARP bool
	// GracePeriod bounds how long a removed real server is kept, at weight
	// 0, while it still has connections; DefaultGracePeriod when zero.
	GracePeriod time.Duration
	// Flavour picks the iptables of the rule layer: FlavourNFT,
	// FlavourLegacy, or "" or "auto" for the one whose rules the node
	// already holds, as mode iptables decides.
	Flavour string
	// NodePortRange is the cluster's node-port range, first and last
	// (kube-apiserver's --service-node-port-range): RemoveKubeProxy tells
	// kube-proxy's node-port virtual servers by it. 30000-32767 when zero.
	NodePortRange [2]uint16
}

// nodePortRange returns the first and last port of o.NodePortRange.
func (o Options) nodePortRange() (first, last uint16) {
	if o.NodePortRange == [2]uint16{} {
		return 30000, 32767
	}
	return o.NodePortRange[0], o.NodePortRange[1]
}

// withDefaults returns o with its zero fields filled, or an error naming
// the first invalid field.
func (o Options) withDefaults() (Options, error) {
	if o.Scheduler == "" {
		o.Scheduler = DefaultScheduler
	}
	if !slices.Contains(Schedulers, o.Scheduler) {
		return o, fmt.Errorf("ipvs: Options.Scheduler %q: want one of %s", o.Scheduler, strings.Join(Schedulers, ", "))
	}
	if o.Interface == "" {
		o.Interface = DefaultInterface
	}
	if len(o.Interface) > 15 || strings.ContainsAny(o.Interface, "/ \t\n") {
		return o, fmt.Errorf("ipvs: Options.Interface %q: want an interface name of at most 15 characters without '/' or spaces", o.Interface)
	}
	if o.GracePeriod < 0 {
		return o, fmt.Errorf("ipvs: Options.GracePeriod %s: must not be negative", o.GracePeriod)
	}
	if o.GracePeriod == 0 {
		o.GracePeriod = DefaultGracePeriod
	}
	return o, nil
}
