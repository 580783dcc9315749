package vm

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// Kernel is an unpacked kernel package: the image QEMU boots and the tree
// of its modules.
type Kernel struct {
	// Release is the kernel's release, as uname -r prints it.
	Release string
	// Image is the path of the vmlinuz file.
	Image string
	// Modules is the path of lib/modules/<Release>.
	Modules string
}

// CacheDir returns where fetched kernels are kept: $WEIRTEST_VM_CACHE, or
// weir-vm in the user's cache folder.
func CacheDir() string {
	if d := os.Getenv("WEIRTEST_VM_CACHE"); d != "" {
		return d
	}
	base, err := os.UserCacheDir()
	if err != nil {
		base = os.TempDir()
	}
	return filepath.Join(base, "weir-vm")
}

// Fetch returns the kernel of the Debian package pkg ("name=version"),
// downloaded with apt-get download and unpacked with dpkg -x into
// cacheDir/name_version the first time, then reused.
func Fetch(ctx context.Context, pkg, cacheDir string) (*Kernel, error) {
	name, version, ok := strings.Cut(pkg, "=")
	if !ok || name == "" || version == "" {
		return nil, fmt.Errorf("vm: kernel package %q: want name=version", pkg)
	}
	dir := filepath.Join(cacheDir, name+"_"+version)
	if k, err := unpacked(dir); err == nil {
		return k, nil
	}
	if err := os.MkdirAll(cacheDir, 0o755); err != nil {
		return nil, fmt.Errorf("vm: %w", err)
	}
	work, err := os.MkdirTemp(cacheDir, "fetch-")
	if err != nil {
		return nil, fmt.Errorf("vm: %w", err)
	}
	defer os.RemoveAll(work)
	// apt-get download writes into the current folder; as root it warns
	// that the _apt user cannot write there, which is harmless.
	get := exec.CommandContext(ctx, "apt-get", "download", pkg)
	get.Dir = work
	if out, err := get.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("vm: apt-get download %s (is the pin still in the archive?): %w: %s", pkg, err, out)
	}
	debs, _ := filepath.Glob(filepath.Join(work, "*.deb"))
	if len(debs) != 1 {
		return nil, fmt.Errorf("vm: apt-get download %s left %d packages", pkg, len(debs))
	}
	tree := filepath.Join(work, "tree")
	if out, err := exec.CommandContext(ctx, "dpkg", "-x", debs[0], tree).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("vm: dpkg -x %s: %w: %s", debs[0], err, out)
	}
	if _, err := unpacked(tree); err != nil {
		return nil, err
	}
	if err := os.Rename(tree, dir); err != nil {
		return nil, fmt.Errorf("vm: %w", err)
	}
	return unpacked(dir)
}

// unpacked finds the kernel in an unpacked package folder.
func unpacked(dir string) (*Kernel, error) {
	images, _ := filepath.Glob(filepath.Join(dir, "boot", "vmlinuz-*"))
	if len(images) != 1 {
		return nil, fmt.Errorf("vm: %s holds %d kernel images, want 1", dir, len(images))
	}
	release := strings.TrimPrefix(filepath.Base(images[0]), "vmlinuz-")
	modules := filepath.Join(dir, "lib", "modules", release)
	if _, err := os.Stat(modules); err != nil {
		return nil, fmt.Errorf("vm: %w", err)
	}
	return &Kernel{Release: release, Image: images[0], Modules: modules}, nil
}
