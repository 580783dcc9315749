// Package backends defines the contract between Weir's pipeline and the code
// that programs the kernel, and the options the backends share.
package backends

import (
	"context"

	"github.com/weirproxy/weir/sdk/plan"
)

// Backend turns a plan into kernel state.
type Backend interface {
	// Sync makes the kernel match p. A nil changed asks for a full sync: the
	// backend makes the kernel match the whole plan and repairs what it can
	// detect was changed behind its back, but need not rewrite everything
	// (the iptables backend rewrites at most hourly and reconciles between).
	// Otherwise only the listed keys changed since the last successful Sync,
	// and keys absent from p were deleted. A failed Sync leaves the
	// previously committed rules serving.
	Sync(ctx context.Context, p *plan.Plan, changed []plan.Key) error
	// Cleanup removes everything the backend ever installed.
	Cleanup(ctx context.Context) error
}
