package vm

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// requireVM skips (fails under CI=true) unless this machine can run VMs:
// root, qemu-system-x86_64, busybox and apt-get.
func requireVM(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("VM test: -short (make test-fast) leaves out the VM")
	}
	var missing []string
	if os.Geteuid() != 0 {
		missing = append(missing, "root")
	}
	for _, tool := range []string{"qemu-system-x86_64", "busybox", "apt-get", "dpkg"} {
		if _, err := exec.LookPath(tool); err != nil {
			missing = append(missing, tool)
		}
	}
	if len(missing) == 0 {
		return
	}
	msg := "needs " + strings.Join(missing, ", ") + " to boot a VM (apt-get install qemu-system-x86 busybox-static)"
	if os.Getenv("CI") == "true" {
		t.Fatal(msg + " (CI=true: VM tests must run)")
	}
	t.Skip(msg)
}

func TestCPIOUnpacks(t *testing.T) {
	if _, err := exec.LookPath("busybox"); err != nil {
		requireVM(t)
	}
	var tr tree
	tr.file("etc/hello", 0o644, []byte("hello, vm\n"))
	tr.file("bin/odd", 0o755, []byte("abc"))
	tr.symlink("var/run", "/run")
	var buf bytes.Buffer
	if err := writeCPIO(&buf, tr.entries); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	cmd := exec.Command("busybox", "cpio", "-i", "-d")
	cmd.Dir, cmd.Stdin = dir, &buf
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("busybox cpio cannot unpack the archive: %v: %s", err, out)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "etc/hello")); err != nil || string(b) != "hello, vm\n" {
		t.Errorf("etc/hello = %q, %v", b, err)
	}
	if st, err := os.Stat(filepath.Join(dir, "bin/odd")); err != nil || st.Mode().Perm() != 0o755 || st.Size() != 3 {
		t.Errorf("bin/odd: %v, %v", st, err)
	}
	if target, err := os.Readlink(filepath.Join(dir, "var/run")); err != nil || target != "/run" {
		t.Errorf("var/run links to %q, %v", target, err)
	}
}

func TestInitScriptQuotes(t *testing.T) {
	s := initScript(Options{Args: []string{"-test.run", "A|B", "it's"}, Env: []string{"CI=true"}, Modules: []string{"ip_vs"}})
	for _, want := range []string{"modprobe 'ip_vs'", "export 'CI=true'", `/program '-test.run' 'A|B' 'it'\''s'`, "echo " + exitMarker + "$?"} {
		if !strings.Contains(s, want) {
			t.Errorf("init script lacks %q:\n%s", want, s)
		}
	}
}

// TestInitScriptKeepsHostFilesVisible: a fresh tmpfs goes over /tmp and
// /run unless a host file lives there (a checkout in /tmp), which it would
// hide.
func TestInitScriptKeepsHostFilesVisible(t *testing.T) {
	s := initScript(Options{})
	if !strings.Contains(s, "mount -t tmpfs tmpfs /tmp\n") || !strings.Contains(s, "mount -t tmpfs tmpfs /run\n") {
		t.Errorf("without host files there, /tmp and /run are not tmpfs:\n%s", s)
	}
	s = initScript(Options{HostFiles: []string{"/usr/sbin/ip", "/tmp/ci/bin/plugins/p.wasm"}})
	if strings.Contains(s, "tmpfs /tmp") || !strings.Contains(s, "mount -t tmpfs tmpfs /run\n") {
		t.Errorf("with a host file in /tmp, /tmp is mounted over or /run is not:\n%s", s)
	}
}

func TestScanConsole(t *testing.T) {
	var out bytes.Buffer
	code, found := scanConsole(strings.NewReader("boot\r\nok 1\r\n"+exitMarker+"3\r\n[ 9.5] reboot: Power down\r\n"), &out)
	if !found || code != 3 {
		t.Errorf("exit code %d, %v; want 3", code, found)
	}
	if out.String() != "boot\nok 1\n[ 9.5] reboot: Power down\n" {
		t.Errorf("console copied as %q", out.String())
	}
	if _, found := scanConsole(strings.NewReader("Kernel panic - not syncing\n"), nil); found {
		t.Error("an exit code found in a console without one")
	}
}

// TestRunReportsExitCode boots the pinned kernel with a probe program: the
// VM runs the kernel asked for, loads IPVS, runs a host program with its
// libraries, streams the output and returns the program's exit code.
func TestRunReportsExitCode(t *testing.T) {
	requireVM(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	k, err := Fetch(ctx, DefaultPackage, CacheDir())
	if err != nil {
		t.Fatal(err)
	}
	probe := filepath.Join(t.TempDir(), "probe")
	build := exec.Command("go", "build", "-o", probe, "./testdata/probe")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build probe: %v: %s", err, out)
	}
	ip, err := exec.LookPath("ip")
	if err != nil {
		t.Fatal(err)
	}
	ip, _ = filepath.EvalSymlinks(ip)
	var console bytes.Buffer
	code, err := Run(ctx, Options{Kernel: k, Program: probe, Args: []string{"7", "ip_vs", ip, "-V"},
		Modules: []string{"ip_vs"}, HostFiles: []string{ip}, Output: &console})
	if err != nil {
		t.Fatalf("%v\n%s", err, console.String())
	}
	if code != 7 {
		t.Errorf("exit code %d, want 7", code)
	}
	for _, want := range []string{"probe: release " + k.Release, "probe: module ip_vs loaded: true", "iproute2", "(error <nil>)"} {
		if !strings.Contains(console.String(), want) {
			t.Errorf("console lacks %q:\n%s", want, console.String())
		}
	}
}
