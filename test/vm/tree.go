package vm

import (
	"bufio"
	"debug/elf"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// moduleDirs are the parts of a kernel's module tree a VM gets: networking
// and what it depends on. The rest (file systems, most drivers) would only
// make the initramfs larger and the boot slower.
var moduleDirs = []string{"kernel/net", "kernel/lib", "kernel/crypto", "kernel/arch", "kernel/drivers/net"}

// tree collects the files of an initramfs.
type tree struct {
	entries []entry
	seen    map[string]bool
}

// add records e unless its name is already there.
func (t *tree) add(e entry) {
	if t.seen == nil {
		t.seen = map[string]bool{}
	}
	e.name = strings.TrimPrefix(filepath.Clean(e.name), "/")
	if t.seen[e.name] {
		return
	}
	t.seen[e.name] = true
	t.entries = append(t.entries, e)
}

// dir adds a directory and its parents.
func (t *tree) dir(name string) {
	name = strings.TrimPrefix(filepath.Clean(name), "/")
	if name == "." || name == "" || t.seen[name] {
		return
	}
	t.dir(filepath.Dir(name))
	t.add(entry{name: name, mode: fs.ModeDir | 0o755})
}

// file adds a regular file (and its parent directories).
func (t *tree) file(name string, perm fs.FileMode, data []byte) {
	t.dir(filepath.Dir(name))
	t.add(entry{name: name, mode: perm, data: data})
}

// symlink adds a symbolic link name → target.
func (t *tree) symlink(name, target string) {
	t.dir(filepath.Dir(name))
	t.add(entry{name: name, mode: fs.ModeSymlink | 0o777, target: target})
}

// copyFile adds host file src as name, following symbolic links.
func (t *tree) copyFile(src, name string, perm fs.FileMode) error {
	data, err := os.ReadFile(src)
	if err != nil {
		return fmt.Errorf("vm: %w", err)
	}
	t.file(name, perm, data)
	return nil
}

// copyTree adds the module tree at src (the parts in moduleDirs and the
// files at its top) under name.
func (t *tree) copyTree(src, name string) error {
	tops, err := os.ReadDir(src)
	if err != nil {
		return fmt.Errorf("vm: module tree: %w", err)
	}
	for _, e := range tops {
		if e.Type().IsRegular() {
			if err := t.copyFile(filepath.Join(src, e.Name()), filepath.Join(name, e.Name()), 0o644); err != nil {
				return err
			}
		}
	}
	for _, sub := range moduleDirs {
		root := filepath.Join(src, sub)
		err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
			if err != nil || !d.Type().IsRegular() {
				return err
			}
			rel, _ := filepath.Rel(src, path)
			return t.copyFile(path, filepath.Join(name, rel), 0o644)
		})
		if err != nil && !os.IsNotExist(err) {
			return fmt.Errorf("vm: module tree: %w", err)
		}
	}
	return nil
}

// copyWithLibraries adds host file path at the same path (a folder: every
// file in it) and, for dynamically linked programs and libraries, the
// shared libraries ldd lists for them.
func (t *tree) copyWithLibraries(path string) error {
	st, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("vm: host file: %w", err)
	}
	if st.IsDir() {
		return filepath.WalkDir(path, func(p string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			return t.copyWithLibraries(p)
		})
	}
	if err := t.copyFile(path, path, st.Mode().Perm()); err != nil {
		return err
	}
	if !dynamic(path) {
		return nil
	}
	libs, err := sharedLibraries(path)
	if err != nil {
		return err
	}
	for _, lib := range libs {
		if err := t.copyFile(lib, lib, 0o755); err != nil {
			return err
		}
	}
	return nil
}

// sharedLibraries lists the absolute paths ldd prints for program.
func sharedLibraries(program string) ([]string, error) {
	out, err := exec.Command("ldd", program).Output()
	if err != nil {
		return nil, fmt.Errorf("vm: ldd %s: %w", program, err)
	}
	var libs []string
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	for sc.Scan() {
		// "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)" or
		// "/lib64/ld-linux-x86-64.so.2 (0x...)".
		for _, f := range strings.Fields(sc.Text()) {
			if strings.HasPrefix(f, "/") {
				libs = append(libs, f)
				break
			}
		}
	}
	return libs, nil
}

// dynamic says whether path is an ELF file that needs shared libraries.
func dynamic(path string) bool {
	f, err := elf.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	libs, _ := f.ImportedLibraries()
	return len(libs) > 0
}

// isStatic says whether path is an ELF program without an interpreter,
// which runs in the VM without shared libraries.
func isStatic(path string) bool {
	f, err := elf.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return false
		}
	}
	return true
}

// requireStatic fails unless path is a static ELF program.
func requireStatic(path string) error {
	if !isStatic(path) {
		return fmt.Errorf("vm: %s is not a static executable (build Go with CGO_ENABLED=0)", path)
	}
	return nil
}
