// Package backends defines the contract between Weir's pipeline and the code
// that programs the kernel, and the options the backends share.
package backends

import (
	"context"

	"github.com/weirproxy/weir/sdk/plan"
)

// Backend turns a plan into kernel state.
type Backend interface {
	// Sync makes the kernel match p, wholly or for the keys req lists (see
	// SyncRequest). A failed Sync leaves the previously committed rules
	// serving.
	Sync(ctx context.Context, p *plan.Plan, req SyncRequest) error
	// Cleanup removes everything the backend ever installed.
	Cleanup(ctx context.Context) error
}

// SyncRequest says how much of a plan a Sync call must bring into the
// kernel.
type SyncRequest struct {
	// Full asks for a full sync: the backend makes the kernel match the
	// whole plan and repairs what it can detect was changed behind its
	// back, but need not rewrite everything (the iptables backend rewrites
	// at most hourly and reconciles between). Changed is ignored then.
	Full bool
	// Changed lists, for a partial sync, the keys that changed since the
	// last successful Sync; a listed key absent from the plan was deleted.
	// An empty list is a partial sync of nothing but the node's own state.
	Changed []plan.Key
}

// FullSync returns the request for a full sync.
func FullSync() SyncRequest { return SyncRequest{Full: true} }

// PartialSync returns the request for a partial sync of the changed keys.
func PartialSync(changed ...plan.Key) SyncRequest { return SyncRequest{Changed: changed} }

// KubeProxyRemover is a backend that can remove what kube-proxy left in the
// backend's mode while Weir's own rules keep serving: Weir's takeover from
// kube-proxy after its first commit.
type KubeProxyRemover interface {
	// RemoveKubeProxy removes kube-proxy's rules, chains, sets and
	// interfaces of the backend's mode that Weir does not use. It is not an
	// error when there are none.
	RemoveKubeProxy(ctx context.Context) error
}

// HandBacker is a backend that can hand a node back to kube-proxy: `weir
// cleanup --keep-kube-proxy`, run once Weir has stopped and kube-proxy, in
// the mode Weir ran in, has synced. Until then both rule sets serve side
// by side; the hand-back removes what is Weir's alone and leaves what
// kube-proxy now serves with.
type HandBacker interface {
	// HandBack removes Weir's own state of the backend's mode and leaves
	// everything kube-proxy uses, or names as kube-proxy names it. It logs
	// what it removed; it is not an error when there is nothing to remove.
	HandBack(ctx context.Context) error
}

// Reporter is a Backend that says what its latest Sync did in the kernel.
// The proxy asks for the Report after every Sync and turns it into
// metrics; a backend without it reports nothing.
type Reporter interface {
	// Report returns the figures of the latest Sync call; the zero Report
	// before the first.
	Report() Report
}

// The IP families a Report names, spelled as Kubernetes spells them.
const (
	IPv4 = "IPv4"
	IPv6 = "IPv6"
)

// Report is what one Sync call did in the kernel, per IP family.
type Report struct {
	// Families holds one entry per IP family the backend programs.
	Families []FamilyReport
}

// FamilyReport is what one Sync call did in the tables of one IP family.
type FamilyReport struct {
	// Family is IPv4 or IPv6.
	Family string
	// Failed counts the writes the kernel refused during the call (an
	// iptables-restore run, an nftables transaction), including those the
	// backend then retried successfully within the same call.
	Failed int
	// FailedPartial counts the writes among Failed that carried only the
	// changed services.
	FailedPartial int
	// Tables holds, per table name, the rules the backend owns in the table
	// once the call succeeded; nil after a failed call, and for a backend
	// that does not count rules.
	Tables map[string]Rules
}

// Rules counts the backend's rules in one table.
type Rules struct {
	// Total is how many rules the backend owns in the table.
	Total int
	// Written is how many rules the call wrote to the table.
	Written int
}
