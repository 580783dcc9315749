// Package vm boots a pinned Linux kernel under QEMU with a busybox
// initramfs, runs one static program in it (usually a test binary built
// with `CGO_ENABLED=0 go test -c`) and reports the program's output and
// exit code. Kernel tests use it for what the host kernel lacks (IPVS) and
// to run on an older kernel than the host's.
//
// The kernel is a Debian cloud kernel package, downloaded with
// `apt-get download` and unpacked with `dpkg -x` (never installed) into a
// cache folder keyed by package and version. QEMU runs with software
// emulation (TCG): a boot takes 5–10 s.
package vm

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// DefaultPackage is the kernel package Weir's VM tests boot, as
// "name=version": Debian 12's long-term 6.1 cloud kernel, which has IPVS
// as modules.
const DefaultPackage = "linux-image-6.1.0-47-cloud-amd64-unsigned=6.1.170-3"

// exitMarker prefixes the line on which the VM's init reports the
// program's exit code.
const exitMarker = "WEIR-VM-EXIT="

// Options describe one run of a program in a VM.
type Options struct {
	// Kernel is the kernel to boot (see Fetch).
	Kernel *Kernel
	// Program is a static executable, run in the VM as /program with Args.
	Program string
	Args    []string
	// Env holds KEY=VALUE pairs set for the program.
	Env []string
	// Modules are loaded with modprobe (dependencies included) before the
	// program runs.
	Modules []string
	// HostFiles are host files copied into the VM at the same paths; the
	// shared libraries of dynamically linked ones come along (as ldd lists
	// them).
	HostFiles []string
	// MemoryMiB and CPUs size the VM: 1024 MiB and 2 CPUs when zero.
	MemoryMiB, CPUs int
	// Output receives the VM's console (the program's output among it),
	// line by line; nil discards it.
	Output io.Writer
}

// Run boots a VM, runs the program and returns its exit code. An error
// means the VM reported none: QEMU failed or is missing, the kernel
// panicked, or ctx ended (the VM is then killed).
func Run(ctx context.Context, o Options) (int, error) {
	if o.Kernel == nil || o.Program == "" {
		return -1, errors.New("vm: Kernel and Program are required")
	}
	qemu, err := exec.LookPath("qemu-system-x86_64")
	if err != nil {
		return -1, fmt.Errorf("vm: qemu-system-x86_64 not found (apt-get install qemu-system-x86): %w", err)
	}
	dir, err := os.MkdirTemp("", "weir-vm-")
	if err != nil {
		return -1, err
	}
	defer os.RemoveAll(dir)
	initrd := filepath.Join(dir, "initrd.gz")
	if err := buildInitramfs(initrd, o); err != nil {
		return -1, err
	}
	mem, cpus := o.MemoryMiB, o.CPUs
	if mem == 0 {
		mem = 1024
	}
	if cpus == 0 {
		cpus = 2
	}
	cmd := exec.CommandContext(ctx, qemu,
		"-accel", "tcg,thread=multi", "-m", strconv.Itoa(mem), "-smp", strconv.Itoa(cpus),
		"-kernel", o.Kernel.Image, "-initrd", initrd,
		"-append", "console=ttyS0 quiet loglevel=3 panic=-1",
		"-nographic", "-no-reboot", "-nic", "none")
	out, err := cmd.StdoutPipe()
	if err != nil {
		return -1, err
	}
	var qemuErr bytes.Buffer
	cmd.Stderr = &qemuErr
	if err := cmd.Start(); err != nil {
		return -1, fmt.Errorf("vm: start qemu: %w", err)
	}
	code, found := scanConsole(out, o.Output)
	waitErr := cmd.Wait()
	switch {
	case found:
		return code, nil
	case ctx.Err() != nil:
		return -1, fmt.Errorf("vm: %w before the program reported an exit code", ctx.Err())
	default:
		return -1, fmt.Errorf("vm: the VM stopped without an exit code (qemu: %w %s)", waitErr, strings.TrimSpace(qemuErr.String()))
	}
}

// scanConsole copies the console to w line by line and returns the exit
// code the init reports, if it does.
func scanConsole(r io.Reader, w io.Writer) (code int, found bool) {
	if w == nil {
		w = io.Discard
	}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := strings.TrimRight(sc.Text(), "\r")
		if rest, ok := strings.CutPrefix(line, exitMarker); ok {
			if n, err := strconv.Atoi(strings.TrimSpace(rest)); err == nil {
				code, found = n, true
				continue
			}
		}
		fmt.Fprintln(w, line)
	}
	_, _ = io.Copy(io.Discard, r) // drains the console until QEMU exits
	return code, found
}

// buildInitramfs writes the gzipped initramfs of a run to path: busybox,
// the kernel's modules, the host files with their libraries, the program
// and the init script.
func buildInitramfs(path string, o Options) error {
	busybox, err := exec.LookPath("busybox")
	if err != nil {
		return fmt.Errorf("vm: busybox not found (apt-get install busybox-static): %w", err)
	}
	if err := requireStatic(busybox); err != nil {
		return err
	}
	if err := requireStatic(o.Program); err != nil {
		return err
	}
	var t tree
	for _, d := range []string{"bin", "sbin", "usr/bin", "usr/sbin", "proc", "sys", "dev", "run", "tmp", "var", "etc", "lib/modules"} {
		t.dir(d)
	}
	t.symlink("var/run", "/run")
	if err := t.copyFile(busybox, "bin/busybox", 0o755); err != nil {
		return err
	}
	if err := t.copyFile(o.Program, "program", 0o755); err != nil {
		return err
	}
	if err := t.copyTree(o.Kernel.Modules, "lib/modules/"+o.Kernel.Release); err != nil {
		return err
	}
	for _, f := range o.HostFiles {
		if err := t.copyWithLibraries(f); err != nil {
			return err
		}
	}
	t.file("init", 0o755, []byte(initScript(o)))
	var buf bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&buf, gzip.BestSpeed)
	if err := writeCPIO(zw, t.entries); err != nil {
		return err
	}
	if err := zw.Close(); err != nil {
		return err
	}
	return os.WriteFile(path, buf.Bytes(), 0o644)
}

// initScript returns the VM's /init: mount the pseudo file systems, load
// the modules, run the program and report its exit code, power off.
func initScript(o Options) string {
	var b strings.Builder
	b.WriteString(`#!/bin/busybox sh
/bin/busybox --install -s
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
`)
	for _, dir := range []string{"/run", "/tmp"} {
		// A host file under the directory (a checkout in /tmp) must stay
		// visible: the directory then stays on the initramfs's root file
		// system, writable too, instead of a fresh tmpfs hiding it.
		if !slices.ContainsFunc(o.HostFiles, func(f string) bool { return strings.HasPrefix(f, dir+"/") }) {
			fmt.Fprintf(&b, "mount -t tmpfs tmpfs %s\n", dir)
		}
	}
	b.WriteString("ip link set lo up\ndepmod\n")
	for _, m := range o.Modules {
		fmt.Fprintf(&b, "modprobe %s || echo 'weir-vm: modprobe %s failed'\n", shellQuote(m), m)
	}
	b.WriteString("export PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/tmp\n")
	for _, e := range o.Env {
		fmt.Fprintf(&b, "export %s\n", shellQuote(e))
	}
	b.WriteString("cd /tmp\n/program")
	for _, a := range o.Args {
		b.WriteString(" " + shellQuote(a))
	}
	fmt.Fprintf(&b, "\necho %s$?\npoweroff -f\n", exitMarker)
	return b.String()
}

// shellQuote quotes s for sh.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
