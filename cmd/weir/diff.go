package main

import (
	"strings"

	"github.com/weirproxy/weir/sdk/plan"
)

// diffLine is one line of a line diff: ' ' kept, '-' removed, '+' added.
type diffLine struct {
	op   byte
	text string
}

// lineDiff returns the shortest edit turning a into b, line by line
// (longest common subsequence; plans of one service are short).
func lineDiff(a, b []string) []diffLine {
	// lcs[i][j] is the common subsequence length of a[i:] and b[j:].
	lcs := make([][]int, len(a)+1)
	for i := range lcs {
		lcs[i] = make([]int, len(b)+1)
	}
	for i := len(a) - 1; i >= 0; i-- {
		for j := len(b) - 1; j >= 0; j-- {
			if a[i] == b[j] {
				lcs[i][j] = lcs[i+1][j+1] + 1
			} else {
				lcs[i][j] = max(lcs[i+1][j], lcs[i][j+1])
			}
		}
	}
	var out []diffLine
	i, j := 0, 0
	for i < len(a) || j < len(b) {
		switch {
		case i < len(a) && j < len(b) && a[i] == b[j]:
			out = append(out, diffLine{' ', a[i]})
			i, j = i+1, j+1
		case i < len(a) && (j == len(b) || lcs[i+1][j] >= lcs[i][j+1]):
			out = append(out, diffLine{'-', a[i]})
			i++
		default:
			out = append(out, diffLine{'+', b[j]})
			j++
		}
	}
	return out
}

// serviceLines splits a service's text into lines; nil has none.
func serviceLines(s *plan.Service) []string {
	if s == nil {
		return nil
	}
	return strings.Split(strings.TrimSuffix(s.String(), "\n"), "\n")
}

// planText renders the final plan; after each service a plugin changed, it
// says which plugin changed which lines, as comments.
func planText(p *plan.Plan, changes []change) string {
	byKey := map[plan.Key][]change{}
	for _, c := range changes {
		byKey[c.before.Key] = append(byKey[c.before.Key], c)
	}
	var b strings.Builder
	b.WriteString(p.Node.String())
	for _, k := range p.Keys() {
		b.WriteString(p.Services[k].String())
		for _, c := range byKey[k] {
			b.WriteString("  # plugin " + c.plugin + " changed:\n")
			for _, l := range lineDiff(serviceLines(c.before), serviceLines(c.after)) {
				if l.op != ' ' {
					b.WriteString("  #   " + string(l.op) + " " + strings.TrimSpace(l.text) + "\n")
				}
			}
		}
	}
	return b.String()
}
