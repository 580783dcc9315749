package conformance

import (
	"context"
	"strings"
	"testing"

	"github.com/weirproxy/weir/backends"
	"github.com/weirproxy/weir/sdk/plan"
)

// ReadingBackend is a backend that can read its rules back from the kernel.
type ReadingBackend interface {
	backends.Backend
	backends.Reader
}

// CheckReadBack wraps b so that every successful sync reads the kernel back
// and fails t on any divergence from what the plan expects: the table's
// plans then exercise the backend's ReadBack and Expected too.
func CheckReadBack(t *testing.T, b ReadingBackend) backends.Backend {
	return readBackChecked{b, t}
}

type readBackChecked struct {
	ReadingBackend
	t *testing.T
}

// Sync syncs, then reads back and compares.
func (c readBackChecked) Sync(ctx context.Context, p *plan.Plan, req backends.SyncRequest) error {
	if err := c.ReadingBackend.Sync(ctx, p, req); err != nil {
		return err
	}
	got, err := c.ReadBack(ctx)
	if err != nil {
		c.t.Errorf("read back after a sync: %v", err)
		return nil
	}
	want, owners := c.Expected(p)
	if d := backends.Compare(want, owners, got); len(d) > 0 {
		lines := make([]string, len(d))
		for i, x := range d {
			lines[i] = x.String()
		}
		c.t.Errorf("after a sync (full %v) the kernel read back diverges from the plan:\n%s", req.Full, strings.Join(lines, "\n"))
	}
	return nil
}
