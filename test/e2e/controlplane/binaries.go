package controlplane

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Binaries names the three programs of the control plane and kube-proxy,
// which tests run beside Weir as the reference it is compared with.
type Binaries struct {
	Etcd              string
	APIServer         string
	ControllerManager string
	KubeProxy         string
}

// The environment that locates the binaries.
const (
	// BinEnv names a folder holding etcd, kube-apiserver,
	// kube-controller-manager and kube-proxy; it overrides the cache lookup.
	BinEnv = "WEIRTEST_CONTROLPLANE_BIN"
	// CacheEnv is the cache root hack/controlplane/build.sh builds into.
	CacheEnv = "WEIRTEST_CONTROLPLANE_CACHE"
)

// toolsModule is the tools module's go.mod, relative to the repository root.
const toolsModule = "hack/controlplane/go.mod"

// FindBinaries locates the control plane's binaries: in $WEIRTEST_CONTROLPLANE_BIN
// when set, otherwise in the folder of build.sh's cache for the versions
// hack/controlplane/go.mod pins (found by walking up from the working
// directory). The error says how to build them.
func FindBinaries() (Binaries, error) {
	dir := os.Getenv(BinEnv)
	if dir == "" {
		var err error
		if dir, err = cacheDir(); err != nil {
			return Binaries{}, err
		}
	}
	b := Binaries{
		Etcd:              filepath.Join(dir, "etcd"),
		APIServer:         filepath.Join(dir, "kube-apiserver"),
		ControllerManager: filepath.Join(dir, "kube-controller-manager"),
		KubeProxy:         filepath.Join(dir, "kube-proxy"),
	}
	for _, p := range []string{b.Etcd, b.APIServer, b.ControllerManager, b.KubeProxy} {
		if _, err := os.Stat(p); err != nil {
			return Binaries{}, fmt.Errorf("control plane binary missing (run `make controlplane`): %w", err)
		}
	}
	return b, nil
}

// RequireBinaries is FindBinaries for a test: it skips the test when the
// binaries are missing, or fails it with CI=true in the environment, so CI
// cannot silently skip end-to-end tests.
func RequireBinaries(t testing.TB) Binaries {
	t.Helper()
	b, err := FindBinaries()
	if err == nil {
		return b
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("%v (CI=true: end-to-end tests must run)", err)
	}
	t.Skip(err)
	return Binaries{}
}

// cacheDir is build.sh's output folder for the pinned versions:
// <cache root>/k8s-<kubernetes version>-etcd-<etcd version>.
func cacheDir() (string, error) {
	mod, err := findUp(toolsModule)
	if err != nil {
		return "", fmt.Errorf("set %s or run from inside the repository: %w", BinEnv, err)
	}
	k8s, etcd, err := pinnedVersions(mod)
	if err != nil {
		return "", err
	}
	root := os.Getenv(CacheEnv)
	if root == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return "", err
		}
		root = filepath.Join(home, ".cache", "weir-controlplane")
	}
	return filepath.Join(root, "k8s-"+k8s+"-etcd-"+etcd), nil
}

// findUp is the first rel found in the working directory or above it.
func findUp(rel string) (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		p := filepath.Join(dir, rel)
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("no %s above the working directory", rel)
		}
		dir = parent
	}
}

// pinnedVersions reads the versions of k8s.io/kubernetes and
// go.etcd.io/etcd/server/v3 from the tools module's require lines.
func pinnedVersions(goMod string) (k8s, etcd string, err error) {
	f, err := os.Open(goMod)
	if err != nil {
		return "", "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(strings.TrimPrefix(strings.TrimSpace(sc.Text()), "require "))
		if len(fields) < 2 || strings.Contains(sc.Text(), "=>") {
			continue
		}
		switch fields[0] {
		case "k8s.io/kubernetes":
			k8s = fields[1]
		case "go.etcd.io/etcd/server/v3":
			etcd = fields[1]
		}
	}
	if err := sc.Err(); err != nil {
		return "", "", err
	}
	if k8s == "" || etcd == "" {
		return "", "", errors.New(goMod + ": no require of k8s.io/kubernetes and go.etcd.io/etcd/server/v3")
	}
	return k8s, etcd, nil
}
