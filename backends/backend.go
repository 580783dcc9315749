// Package backends defines the contract between Weir's pipeline and the code
// that programs the kernel.
package backends

import (
	"context"

	"github.com/weirproxy/weir/sdk/plan"
)

// Backend turns a plan into kernel state.
type Backend interface {
	// Sync makes the kernel match p. When changed is nil the whole plan is
	// written (a full sync); otherwise only the listed keys changed since the
	// last successful Sync, and keys absent from p were deleted. A failed Sync
	// leaves the previously committed rules serving.
	Sync(ctx context.Context, p *plan.Plan, changed []plan.Key) error
	// Cleanup removes everything the backend ever installed.
	Cleanup(ctx context.Context) error
}
