// Command vmtest runs a static program, usually a test binary built with
// `CGO_ENABLED=0 go test -c`, inside a VM booting a pinned kernel (see
// test/vm), streams its output and exits with its exit code. It needs
// root, qemu-system-x86_64, busybox and apt-get.
//
//	vmtest [--kernel name=version] [--modules a,b] [--host-files /usr/sbin/ip] [--env K=V] [--timeout 20m] PROGRAM [ARGS...]
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/weirproxy/weir/test/vm"
)

func main() {
	kernel := flag.String("kernel", vm.DefaultPackage, "kernel package to boot, as name=version")
	modules := flag.String("modules", "", "comma-separated kernel modules to load first")
	hostFiles := flag.String("host-files", "", "comma-separated host programs to copy in, with their libraries")
	env := flag.String("env", "CI=true", "comma-separated KEY=VALUE pairs for the program")
	timeout := flag.Duration("timeout", 20*time.Minute, "longest time the VM may run")
	flag.Parse()
	if flag.NArg() == 0 {
		fmt.Fprintln(os.Stderr, "usage: vmtest [flags] PROGRAM [ARGS...]")
		os.Exit(2)
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	k, err := vm.Fetch(ctx, *kernel, vm.CacheDir())
	if err != nil {
		fatal(err)
	}
	fmt.Printf("vmtest: booting %s (%s) for %s\n", k.Release, *kernel, flag.Arg(0))
	code, err := vm.Run(ctx, vm.Options{
		Kernel: k, Program: flag.Arg(0), Args: flag.Args()[1:],
		Modules: list(*modules), HostFiles: list(*hostFiles), Env: list(*env),
		MemoryMiB: 2048, Output: os.Stdout,
	})
	if err != nil {
		fatal(err)
	}
	fmt.Printf("vmtest: %s exited with %d\n", flag.Arg(0), code)
	os.Exit(code)
}

// list splits a comma-separated flag value, dropping empty items.
func list(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "vmtest:", err)
	os.Exit(1)
}
