package iptables

import (
	"bytes"
	"strings"
)

// savedTable is one table as iptables-save prints it: its chains, each
// with its rules in order.
type savedTable struct {
	chains map[string][]savedRule
}

// savedRule is one rule of iptables-save output: its arguments after
// "-A CHAIN".
type savedRule []string

// parseSave reads the output of iptables-save -t TABLE.
func parseSave(out []byte) *savedTable {
	t := &savedTable{chains: map[string][]savedRule{}}
	for line := range bytes.Lines(out) {
		l := strings.TrimSpace(string(line))
		switch {
		case strings.HasPrefix(l, ":"):
			name, _, _ := strings.Cut(l[1:], " ")
			if _, ok := t.chains[name]; !ok {
				t.chains[name] = nil
			}
		case strings.HasPrefix(l, "-A "):
			args := splitRule(l[3:])
			if len(args) > 0 {
				t.chains[args[0]] = append(t.chains[args[0]], savedRule(args[1:]))
			}
		}
	}
	return t
}

// has says whether the table has chain.
func (t *savedTable) has(chain string) bool {
	_, ok := t.chains[chain]
	return ok
}

// opt returns the value following option name ("-d", "--dport"), whether
// it is negated ("! -d ..."), and whether the rule has the option.
func (r savedRule) opt(name string) (value string, negated, ok bool) {
	for i, a := range r {
		if a == name {
			if i+1 < len(r) {
				value = r[i+1]
			}
			return value, i > 0 && r[i-1] == "!", true
		}
	}
	return "", false, false
}

// value returns the value of option name, or "" (also when negated).
func (r savedRule) value(name string) string {
	v, neg, _ := r.opt(name)
	if neg {
		return ""
	}
	return v
}

// flag says whether the rule has the argument a (e.g. "--rcheck").
func (r savedRule) flag(a string) bool {
	for _, x := range r {
		if x == a {
			return true
		}
	}
	return false
}

// target returns what the rule jumps (-j) or goes (-g) to, or "".
func (r savedRule) target() string {
	if t := r.value("-j"); t != "" {
		return t
	}
	return r.value("-g")
}

// conditional says whether the rule matches anything besides match
// modules and a comment before its target: whether it applies only to
// some of the packets that reach it.
func (r savedRule) conditional() bool {
	for i := 0; i < len(r); i++ {
		switch r[i] {
		case "-j", "-g":
			return false
		case "-m", "--comment":
			i++ // skip the value
		default:
			return true
		}
	}
	return false
}

func (r savedRule) String() string { return strings.Join(quoteArgs(r), " ") }
