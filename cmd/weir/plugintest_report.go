package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/weirproxy/weir/hooks"
	"github.com/weirproxy/weir/sdk/plan"
)

// pluginFailure is one plugin's failure in a pass of the chain: it did not
// load, or a call into it failed (trap, timeout, invalid output,
// quarantine). plugin is "" when the chain did not say which.
type pluginFailure struct {
	plugin string
	err    error
}

// loadFailures returns the open plugins the chain could not load, which
// pass their services through unchanged; none for a nil chain.
func loadFailures(c *hooks.Chain) []pluginFailure {
	if c == nil {
		return nil
	}
	var out []pluginFailure
	for _, f := range c.LoadFailures() {
		out = append(out, pluginFailure{f.Plugin, fmt.Errorf("plugin %q not loaded, its services pass through unchanged: %w", f.Plugin, f.Err)})
	}
	return out
}

// failureText marks each failure for the output, one line each.
func failureText(failures []pluginFailure) string {
	var b strings.Builder
	for _, f := range failures {
		name := f.plugin
		if name == "" {
			name = "(unknown)"
		}
		fmt.Fprintf(&b, "! FAILED plugin %s: %v\n", name, f.err)
	}
	return b.String()
}

// joinFailures returns the failures as one error, each naming its plugin; nil when none.
func joinFailures(failures []pluginFailure) error {
	errs := make([]error, len(failures))
	for i, f := range failures {
		errs[i] = f.err
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("hook plugins failed: %w", err)
	}
	return nil
}

// goldenHeader opens a golden file; lines starting with # are comments.
const goldenHeader = "# weir plugin test --expect golden file: the services after the plugins %s,\n" +
	"# as weir plan prints them, in key order. Lines starting with # are ignored.\n" +
	"# Rewrite it with weir plugin test ... --expect FILE --update.\n"

// goldenText renders the chain's output as a golden file.
func goldenText(plugins []string, out []*plan.Service) string {
	var b strings.Builder
	fmt.Fprintf(&b, goldenHeader, strings.Join(plugins, ", "))
	for _, s := range out {
		if s != nil {
			b.WriteString(s.String())
		}
	}
	return b.String()
}

// writeGolden writes text to path and says so.
func writeGolden(stdout io.Writer, path, text string) error {
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		return err
	}
	_, err := fmt.Fprintf(stdout, "wrote %s\n", path)
	return err
}

// compareGolden fails, listing every difference, unless got matches the
// golden file at path (comments and blank lines aside).
func compareGolden(path, got string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("--expect: %w (write it with --update)", err)
	}
	diffs := goldenDiff(serviceBlocks(string(data)), serviceBlocks(got))
	if len(diffs) == 0 {
		return nil
	}
	return fmt.Errorf("the result differs from %s (- expected, + got):\n%s", path, strings.Join(diffs, "\n"))
}

// block is one service's lines in a golden file.
type block struct {
	name  string // the "service KEY" line
	lines []string
}

// serviceBlocks splits golden text into one block per service, leaving
// out comments and blank lines; lines before the first service form a
// block of their own.
func serviceBlocks(text string) []block {
	var out []block
	for l := range strings.SplitSeq(text, "\n") {
		trimmed := strings.TrimSpace(l)
		if trimmed == "" || strings.HasPrefix(trimmed, "#") {
			continue
		}
		if strings.HasPrefix(l, "service ") || len(out) == 0 {
			out = append(out, block{name: l})
		}
		out[len(out)-1].lines = append(out[len(out)-1].lines, strings.TrimRight(l, " \t\r"))
	}
	return out
}

// goldenDiff describes how got differs from want, service by service.
func goldenDiff(want, got []block) []string {
	index := map[string][]string{}
	for _, b := range got {
		index[b.name] = b.lines
	}
	var diffs []string
	seen := map[string]bool{}
	for _, w := range want {
		seen[w.name] = true
		g, ok := index[w.name]
		if !ok {
			diffs = append(diffs, w.name+": expected, but missing from the result")
			continue
		}
		if d := changedLines(w.lines, g); d != "" {
			diffs = append(diffs, w.name+": differs:\n"+d)
		}
	}
	for _, g := range got {
		if !seen[g.name] {
			diffs = append(diffs, g.name+": in the result, not expected")
		}
	}
	return diffs
}

// changedLines is the line diff of a and b without the kept lines; "" when equal.
func changedLines(a, b []string) string {
	var s strings.Builder
	for _, l := range lineDiff(a, b) {
		if l.op != ' ' {
			s.WriteString("  " + string(l.op) + " " + strings.TrimSpace(l.text) + "\n")
		}
	}
	return strings.TrimSuffix(s.String(), "\n")
}
