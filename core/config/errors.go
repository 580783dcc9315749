package config

import (
	"errors"
	"fmt"
	"io/fs"
	"strings"
)

// Error reports one configuration problem: a bad value, an unknown key, or a
// file that cannot be read or parsed.
//
// Load returns an *Error, or several joined with errors.Join; in either case
// the command should exit with status 2.
type Error struct {
	// Key is the configuration key, such as "syncPeriod" or "source.kind". For
	// an unknown environment variable it is the variable's name; for a file
	// that cannot be read or parsed it is empty.
	Key string
	// Value is the rejected value as written; for a file problem, the file's path.
	Value string
	// Allowed says what would be accepted, worded to follow "use". For an
	// unknown key it lists the known keys at that level, separated by ", ".
	Allowed string
	// Source says where the value came from: "file <path>", "environment
	// WEIR_X", "flag --x" or "default".
	Source string

	kind errorKind
	err  error
}

type errorKind int

const (
	kindValue      errorKind = iota // a known key has a value that is not allowed
	kindUnknownKey                  // the YAML file has a key Weir does not know
	kindUnknownEnv                  // the environment has a WEIR_* variable Weir does not know
	kindUnreadable                  // the file cannot be read
	kindMalformed                   // the file is not valid YAML
	kindKubeProxy                   // a KubeProxyConfiguration field Weir does not implement
)

// Error returns a one-line description that names the key, the value, where
// it came from and what to use instead.
func (e *Error) Error() string {
	switch e.kind {
	case kindUnknownKey:
		return fmt.Sprintf("config: unknown key %q in %s%s", e.Key, e.Source, e.hint("keys"))
	case kindUnknownEnv:
		return fmt.Sprintf("config: unknown environment variable %s%s", e.Key, e.hint("variables"))
	case kindUnreadable:
		return fmt.Sprintf("config: cannot read %s: %v", e.Source, e.cause())
	case kindMalformed:
		return fmt.Sprintf("config: %s is not valid YAML: %v", e.Source, e.err)
	case kindKubeProxy:
		return fmt.Sprintf("config: %s: KubeProxyConfiguration field %s", e.Source, e.Key)
	}
	return fmt.Sprintf("config: %s: %q (from %s) is not allowed; use %s", e.Key, e.Value, e.Source, e.Allowed)
}

// Unwrap returns the underlying error of a file problem, such as an
// *fs.PathError, or nil.
func (e *Error) Unwrap() error { return e.err }

// cause drops the path from a *fs.PathError, which the message already names.
func (e *Error) cause() error {
	var pe *fs.PathError
	if errors.As(e.err, &pe) {
		return pe.Err
	}
	return e.err
}

// hint suggests the known key closest to an unknown one, or lists them all.
func (e *Error) hint(what string) string {
	if e.Allowed == "" {
		return ""
	}
	prefix, name := "", e.Key
	if i := strings.LastIndexByte(e.Key, '.'); i >= 0 && e.kind == kindUnknownKey {
		prefix, name = e.Key[:i+1], e.Key[i+1:]
	}
	known := strings.Split(e.Allowed, ", ")
	if best := closest(name, known); best != "" {
		return fmt.Sprintf("; did you mean %q?", prefix+best)
	}
	return fmt.Sprintf("; known %s: %s", what, e.Allowed)
}

// closest returns the candidate nearest to s, ignoring case, if it is near
// enough to be a likely typo; otherwise "".
func closest(s string, candidates []string) string {
	best, bestDist := "", -1
	for _, c := range candidates {
		d := distance(strings.ToLower(s), strings.ToLower(c))
		if d <= max(1, len(c)/4) && (bestDist < 0 || d < bestDist) {
			best, bestDist = c, d
		}
	}
	return best
}

// distance is the optimal string alignment distance between a and b: the
// number of single-byte insertions, deletions, substitutions and adjacent
// transpositions that turn one into the other.
func distance(a, b string) int {
	d := make([][]int, len(a)+1)
	for i := range d {
		d[i] = make([]int, len(b)+1)
		d[i][0] = i
	}
	for j := range d[0] {
		d[0][j] = j
	}
	for i := 1; i <= len(a); i++ {
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(a)][len(b)]
}
