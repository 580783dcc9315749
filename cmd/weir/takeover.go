package main

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/weirproxy/weir/backends"
	"github.com/weirproxy/weir/backends/iptables"
)

// takeoverTries bounds the passes of a takeover that keeps failing: one
// after each of the first few commits.
const takeoverTries = 3

// takeoverTimeout bounds one pass; the xtables lock may make it wait.
const takeoverTimeout = 2 * time.Minute

// takeover removes what kube-proxy left on the node, once Weir's rules
// serve: after Weir's first commit, and after the next ones while a pass
// failed (at most takeoverTries passes). Passes run one at a time, beside
// the sync loop.
type takeover struct {
	env *environment
	be  backends.Backend

	mu      sync.Mutex
	running bool
	done    bool
	tries   int
}

// takingOver is the proxy's metrics with the takeover told of every
// successful sync.
type takingOver struct {
	observed
	t *takeover
}

// Synced records the sync, then lets the takeover run.
func (o takingOver) Synced(full bool, took time.Duration, end time.Time) {
	o.observed.Synced(full, took, end)
	o.t.committed()
}

// committed starts a pass unless one runs, one succeeded, or the passes
// are used up. It returns at once.
func (t *takeover) committed() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.running || t.done || t.tries >= takeoverTries {
		return
	}
	t.running = true
	t.tries++
	go t.pass()
}

func (t *takeover) pass() {
	ctx, cancel := context.WithTimeout(context.Background(), takeoverTimeout)
	defer cancel()
	err := removeKubeProxy(ctx, t.env, t.be)
	t.mu.Lock()
	defer t.mu.Unlock()
	t.running, t.done = false, err == nil
	switch {
	case err == nil:
		t.env.log.Info("Took over from kube-proxy: its rules are gone, Weir's serve")
	case t.tries < takeoverTries:
		t.env.log.Warn("Could not remove all of kube-proxy's rules; trying again after the next commit", "error", err)
	default:
		t.env.log.Error("Could not remove all of kube-proxy's rules; Weir's rules serve, but remove kube-proxy's by hand", "error", err, "tries", t.tries)
	}
}

// removeKubeProxy removes kube-proxy's state of every mode, keeping what
// be, Weir's running backend, uses. In be's own mode (and, for iptables,
// flavour) be removes only what its layout does not share with
// kube-proxy's; in an iptables flavour Weir does not use, every chain with
// kube-proxy's names goes; in the other modes, kube-proxy's tables,
// virtual servers, interface and ipsets go, and Weir's own leftovers stay.
// The iptables passes run before the IPVS one, which destroys ipsets their
// rules may use.
func removeKubeProxy(ctx context.Context, env *environment, be backends.Backend) error {
	var errs []error
	for _, m := range cleanupTargets {
		var err error
		switch {
		case runsAs(env, be, m.mode, m.flavour):
			if r, ok := be.(backends.KubeProxyRemover); ok {
				err = r.RemoveKubeProxy(ctx)
			}
		case m.mode == "iptables" && !iptables.Installed(m.flavour):
			continue
		case m.mode == "iptables":
			err = cleanupTarget(env, m.mode, m.flavour)
		case m.mode == "ipvs" && !ipvsInKernel():
			continue // no virtual servers; and no ip_vs module to load
		default:
			err = removeKubeProxyOf(ctx, env, m.mode)
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		env.log.Debug("Removed kube-proxy's rules", "mode", m.mode, "flavour", m.flavour)
	}
	return errors.Join(errs...)
}

// runsAs says whether be, in env's mode, is a backend of mode with the
// iptables flavour (when mode has flavours).
func runsAs(env *environment, be backends.Backend, mode, flavour string) bool {
	if env.cfg.Mode != mode {
		return false
	}
	if flavour == "" {
		return true
	}
	f, ok := be.(interface{ Flavour() string })
	return ok && f.Flavour() == flavour
}

// removeKubeProxyOf removes kube-proxy's state of mode with a backend of
// that mode made for it.
func removeKubeProxyOf(ctx context.Context, env *environment, mode string) error {
	be, err := newBackend(envFor(env, mode, ""))
	if err != nil {
		return err
	}
	defer be.Close()
	if r, ok := be.(backends.KubeProxyRemover); ok {
		return r.RemoveKubeProxy(ctx)
	}
	return nil
}
