package xtables

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os/exec"
	"strings"

	"github.com/weirproxy/weir/internal/nsenter"
)

// InNetNS runs fn in the network namespace netNS (an open file descriptor;
// 0 is the caller's own) on a locked thread, so that processes fn starts
// inherit the namespace.
func InNetNS(netNS int, fn func() error) error {
	if netNS == 0 {
		return fn()
	}
	return nsenter.Do(netNS, fn)
}

// Run runs bin with args and stdin (none when nil) inside netNS, writing
// its standard output to stdout, and returns its standard error.
func Run(ctx context.Context, netNS int, stdin []byte, stdout io.Writer, bin string, args ...string) (stderr []byte, err error) {
	var errOut bytes.Buffer
	err = InNetNS(netNS, func() error {
		cmd := exec.CommandContext(ctx, bin, args...)
		if stdin != nil {
			cmd.Stdin = bytes.NewReader(stdin)
		}
		cmd.Stdout, cmd.Stderr = stdout, &errOut
		return cmd.Run()
	})
	return errOut.Bytes(), err
}

// Output is Run returning the standard output too.
func Output(ctx context.Context, netNS int, stdin []byte, bin string, args ...string) (stdout, stderr []byte, err error) {
	var out bytes.Buffer
	stderr, err = Run(ctx, netNS, stdin, &out, bin, args...)
	return out.Bytes(), stderr, err
}

// Save runs bin (an iptables-save) inside netNS, for one table or, when
// table is empty, for every table the flavour has. Its error names the
// command and quotes the first line the tool complained with.
func Save(ctx context.Context, netNS int, bin, table string) ([]byte, error) {
	var args []string
	if table != "" {
		args = []string{"-t", table}
	}
	out, stderr, err := Output(ctx, netNS, nil, bin, args...)
	if err != nil {
		return nil, fmt.Errorf("iptables: %s: %w: %s", strings.Join(append([]string{bin}, args...), " "), err, FirstLine(stderr))
	}
	return out, nil
}

// FirstLine returns the first non-blank line of tool output, trimmed.
func FirstLine(b []byte) string {
	for line := range strings.Lines(string(b)) {
		if s := strings.TrimSpace(line); s != "" {
			return s
		}
	}
	return ""
}
