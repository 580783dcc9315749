package soak

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"
)

// victimSlot is a plugin slot that normally holds a guest that changes
// nothing (testdata/benign) and that a fault replaces with a hostile one (hooks/testdata's
// hostile guest, which misbehaves on batches holding a service annotated
// hostile.weir.dev/act). Each slot sees only the services annotated for
// it.
type victimSlot struct {
	name   string
	policy string // failurePolicy
	mode   string // the hostile guest's mode: panic traps, loop runs into the timeout
}

var victimSlots = []victimSlot{
	{"victim-open-trap", "open", "panic"},
	{"victim-open-loop", "open", "loop"},
	{"victim-closed-trap", "closed", "panic"},
	{"victim-closed-loop", "closed", "loop"},
}

// victimAnnotation routes a service to a victim slot (match.annotations).
func victimAnnotation(slot string) string { return "soak.weir.dev/" + slot }

// guests are the test guests the soak builds: its own benign one and
// hooks/testdata's hostile one.
type guests struct {
	benign, hostile string
}

// buildGuests builds the benign and hostile test guests into dir.
func buildGuests(ctx context.Context, repo, dir string) (*guests, error) {
	g := &guests{benign: filepath.Join(dir, "benign.wasm"), hostile: filepath.Join(dir, "hostile.wasm")}
	for out, pkg := range map[string]string{g.benign: "./test/soak/testdata/benign", g.hostile: "./hooks/testdata/guests/hostile"} {
		bctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
		cmd := exec.CommandContext(bctx, "go", "build", "-buildmode=c-shared", "-o", out, pkg)
		cmd.Dir = repo
		cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm", "CGO_ENABLED=0")
		b, err := cmd.CombinedOutput()
		cancel()
		if err != nil {
			return nil, fmt.Errorf("build test guest %s: %w\n%s", pkg, err, b)
		}
	}
	return g, nil
}

// victimPath is where slot's guest lives; Weir watches it.
func victimPath(dir, slot string) string { return filepath.Join(dir, slot+".wasm") }

// installGuest puts the guest at src into slot's file through a rename,
// as an operator's deployment would, so Weir never reads half a file.
func installGuest(dir, slot, src string) error {
	data, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	tmp := filepath.Join(dir, "."+slot+".tmp")
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, victimPath(dir, slot))
}

// weirConfig is Weir's configuration file for the soak: the kubernetes
// source as Weir's ServiceAccount (or the files source), a short syncPeriod, the canary and
// affinity example plugins and the victim slots.
func weirConfig(cfg *Config, kubeconfig, manifests, pluginDir, cacheDir string) string {
	source := "  kind: kubernetes\n  kubeconfig: " + kubeconfig
	if cfg.Source == "files" {
		source = "  kind: files\n  path: " + manifests
	}
	s := fmt.Sprintf(`mode: %s
nodeName: %s
source:
%s
clusterCIDRs: [10.244.0.0/16, "fd00:10:244::/64"]
syncPeriod: %s
minSyncPeriod: %s
metricsBindAddress: %s
healthzBindAddress: %s
hooks:
  cacheDir: %s
`, cfg.backendMode(), nodeName, source, cfg.SyncPeriod, cfg.MinSyncPeriod, metricsAddr, healthzAddr, cacheDir)
	if f := cfg.flavour(); f != "" {
		s += "iptables:\n  backend: " + f + "\n"
	}
	if cfg.NoPlugins {
		return s
	}
	s += fmt.Sprintf(`plugins:
  - name: canary
    path: %s
    match:
      annotations: [%s]
  - name: affinity
    path: %s
    match:
      annotations: [%s]
`, filepath.Join(cfg.Plugins, "canary.wasm"), canaryAnnotation, filepath.Join(cfg.Plugins, "affinity.wasm"), affinityAnnotation)
	for _, v := range victimSlots {
		s += fmt.Sprintf(`  - name: %s
    path: %s
    failurePolicy: %s
    config: {mode: %s}
    match:
      annotations: [%s]
`, v.name, victimPath(pluginDir, v.name), v.policy, v.mode, victimAnnotation(v.name))
	}
	return s
}
