// Command weir is a Kubernetes Service proxy: a kube-proxy replacement whose
// rule plan passes through WASM hook plugins before a kernel backend commits it.
package main

import (
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/spf13/pflag"

	"github.com/weirproxy/weir/core/config"
)

// Exit codes: 1 for a failed operation, 2 for bad usage or configuration.
const (
	exitFailed = 1
	exitUsage  = 2
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

type command struct {
	name    string
	summary string
	flags   func(fs *pflag.FlagSet)
	run     func(env *environment) error
	// direct, when set, runs the command without Weir's configuration.
	direct func(args []string, stdout, stderr io.Writer) error
	// takesArgs is set for a command that reads arguments besides its
	// flags (env.flags.Args()).
	takesArgs bool
}

var commands = []command{
	{"run", "watch the source and keep the kernel's rules in sync (the daemon)", nil, runDaemon, nil, false},
	{"sync", "sync the rules once and exit (requires --once)", syncFlags, runSync, nil, false},
	{"plan", "print the rule plan computed from the source, after the plugins; touches no kernel", loadFlags, runPlan, nil, false},
	{"verify", "compare the kernel's rules with the plan and list every divergence; writes nothing", verifyFlags, runVerify, nil, false},
	{"diagnose", "explain why a service works or not on this node (NAMESPACE/NAME[:PORT], --all, or node); writes nothing", diagnoseFlags, runDiagnose, nil, true},
	{"cleanup", "remove Weir's and kube-proxy's rules, in every mode (--keep-kube-proxy: only Weir's own, to hand back to kube-proxy)", cleanupFlags, runCleanup, nil, false},
	{"plugin", "plugin test: run hook plugins as a chain over a manifests folder and show the diff; plugin new: write a plugin skeleton; plugin push: push a plugin (signed with --sign-key) to an OCI registry", nil, nil, runPluginCommand, false},
	{"config", "config convert FILE: print the Weir configuration equivalent to a KubeProxyConfiguration", nil, nil, runConfigCommand, false},
	{"version", "print the version", nil, nil, nil, false},
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage(stderr)
		return exitUsage
	}
	cmd := findCommand(args[0])
	if cmd == nil {
		fmt.Fprintf(stderr, "weir: unknown command %q\n\n", args[0])
		usage(stderr)
		return exitUsage
	}
	if cmd.name == "version" {
		fmt.Fprintf(stdout, "weir %s\n", version)
		return 0
	}
	if cmd.direct != nil {
		return directResult(cmd, cmd.direct(args[1:], stdout, stderr), stderr)
	}
	env, err := setup(cmd, args[1:], stdout, stderr)
	if errors.Is(err, pflag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "weir %s: %v\n", cmd.name, err)
		var cerr *config.Error
		if errors.As(err, &cerr) || errors.Is(err, errUsage) || errors.Is(err, pflag.ErrHelp) {
			return exitUsage
		}
		return exitFailed
	}
	if err := cmd.run(env); err != nil {
		env.log.Error("Failed to execute "+cmd.name, "error", err)
		if errors.Is(err, errUsage) {
			return exitUsage
		}
		return exitFailed
	}
	return 0
}

// directResult reports a direct command's error and picks the exit code.
func directResult(cmd *command, err error, stderr io.Writer) int {
	switch {
	case err == nil || errors.Is(err, pflag.ErrHelp):
		return 0
	case errors.Is(err, errUsage):
		fmt.Fprintf(stderr, "weir %s: %v\n", cmd.name, err)
		return exitUsage
	}
	fmt.Fprintf(stderr, "weir %s: %v\n", cmd.name, err)
	return exitFailed
}

func findCommand(name string) *command {
	for i := range commands {
		if commands[i].name == name {
			return &commands[i]
		}
	}
	return nil
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "Usage: weir <command> [flags]\n\nCommands:")
	for _, c := range commands {
		fmt.Fprintf(w, "  %-8s %s\n", c.name, c.summary)
	}
	fmt.Fprintln(w, "\nRun 'weir <command> --help' for the flags of a command.")
}
