package compare

import (
	"github.com/weirproxy/weir/test/e2e/controlplane"
	"github.com/weirproxy/weir/test/programt"
)

// StartControlPlane starts the test control plane (test/e2e/controlplane)
// for a program rather than a test, its files under dir; stop stops it and
// removes them. logf receives its progress lines.
func StartControlPlane(dir string, logf func(format string, args ...any)) (cp *controlplane.ControlPlane, stop func(), err error) {
	t := programt.New("compare", dir, logf)
	if err := programt.Catch(func() { cp = controlplane.Start(t) }); err != nil {
		t.Close()
		return nil, nil, err
	}
	return cp, t.Close, nil
}
