package iptables

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"regexp"
	"strconv"
	"strings"

	"github.com/weirproxy/weir/backends/internal/xtables"
)

// inNetNS runs fn in the network namespace netNS (0: the caller's own) on a
// locked thread, so that processes fn starts inherit the namespace.
func inNetNS(netNS int, fn func() error) error { return xtables.InNetNS(netNS, fn) }

// runTool runs bin with args and stdin inside netNS and returns its
// standard output and standard error.
func runTool(ctx context.Context, netNS int, stdin []byte, bin string, args ...string) (stdout, stderr []byte, err error) {
	return xtables.Output(ctx, netNS, stdin, bin, args...)
}

// runRestore feeds text to bin (an iptables-restore) inside netNS. It never
// flushes what the text does not name (--noflush) and waits at most
// xtables.LockWait for the xtables lock when another writer holds it, then
// fails with an *xtables.LockError. What the text lists (-S, see
// listFirst) is discarded. On other failures the error quotes the tool's
// complaint and the input line it names.
func runRestore(ctx context.Context, netNS int, bin string, text []byte) error {
	stderr, err := xtables.Run(ctx, netNS, text, io.Discard, bin, append([]string{"--noflush"}, xtables.WaitArgs()...)...)
	if err != nil {
		if lerr := xtables.CheckLock(bin, stderr, err); lerr != nil {
			return lerr
		}
		return restoreError(bin, text, stderr, err)
	}
	return nil
}

// runSave runs bin (an iptables-save) inside netNS, for one table or, when
// table is empty, for every table the flavour has.
func runSave(ctx context.Context, netNS int, bin, table string) ([]byte, error) {
	return xtables.Save(ctx, netNS, bin, table)
}

// lineNumber finds the input line iptables-restore blames: legacy says
// "line 5 failed", nft "Error occurred at line: 5".
var lineNumber = regexp.MustCompile(`line:? (\d+)`)

// restoreError describes a failed iptables-restore run: its complaint and,
// when it names one, the failing line of the input.
func restoreError(bin string, text, stderr []byte, err error) error {
	msg := complaint(stderr)
	if msg == "" {
		msg = err.Error()
	}
	table := tableOf(text)
	m := lineNumber.FindSubmatch(stderr)
	if m == nil {
		return &restoreFailure{msg: fmt.Sprintf("iptables: %s (table %s): %s", bin, table, msg), err: err}
	}
	n, _ := strconv.Atoi(string(m[1]))
	line := inputLine(text, n)
	return &restoreFailure{msg: fmt.Sprintf("iptables: %s (table %s): %s; input line %d: %q", bin, table, msg, n, line), line: line, err: err}
}

// complaint returns what a tool's standard error says: its first
// non-blank line, and the next one too when the first only introduces it
// (iptables-nft-restore prints "iptables-nft-restore v1.8.9 (nf_tables): "
// and the error on the next line).
func complaint(stderr []byte) string {
	first := xtables.FirstLine(stderr)
	if !strings.HasSuffix(first, ":") {
		return first
	}
	_, rest, _ := bytes.Cut(stderr, []byte(first))
	if next := xtables.FirstLine(rest); next != "" {
		return first + " " + next
	}
	return first
}

// restoreFailure is a failed iptables-restore run: a message quoting the
// tool, the input line it blamed ("" when it named none), and the error of
// the run.
type restoreFailure struct {
	msg, line string
	err       error
}

func (e *restoreFailure) Error() string { return e.msg }
func (e *restoreFailure) Unwrap() error { return e.err }

// inputLine returns line n (1-based) of text, or "" when there is none.
func inputLine(text []byte, n int) string {
	sc := bufio.NewScanner(bytes.NewReader(text))
	sc.Buffer(nil, 1<<20)
	for i := 1; sc.Scan(); i++ {
		if i == n {
			return sc.Text()
		}
	}
	return ""
}

// tableOf returns the table a restore text writes ("nat" for "*nat").
func tableOf(text []byte) string {
	for line := range bytes.Lines(text) {
		if t, ok := bytes.CutPrefix(bytes.TrimSpace(line), []byte("*")); ok {
			return string(t)
		}
	}
	return "?"
}

// hasRules says whether a restore text changes anything: whether it holds a
// line besides the table header, COMMIT and comments.
func hasRules(text []byte) bool {
	for line := range bytes.Lines(text) {
		l := bytes.TrimSpace(line)
		if len(l) > 0 && l[0] != '*' && l[0] != '#' && !bytes.Equal(l, []byte("COMMIT")) {
			return true
		}
	}
	return false
}
