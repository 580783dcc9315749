package main

import (
	"errors"
	"strconv"
	"strings"
)

// maxGroups is the most named groups one annotation may list.
const maxGroups = 8

// split is a parsed annotation: named groups prefix[:n] with their
// percentages, and the rest (endpoints in no group) with percent[n].
type split struct {
	prefix  [maxGroups]string
	percent [maxGroups + 1]uint64
	n       int
}

// parseSplit parses "prefix=percent[,prefix=percent...]"; percentages are
// integers 0..100 (a trailing % is allowed) adding up to at most 100.
func parseSplit(v string) (split, error) {
	var sp split
	var total uint64
	for rest, more := v, true; more; {
		var item string
		item, rest, more = strings.Cut(rest, ",")
		name, pct, ok := strings.Cut(item, "=")
		name, pct = strings.TrimSpace(name), strings.TrimSpace(pct)
		switch {
		case !ok:
			return sp, errors.New("group " + strconv.Quote(strings.TrimSpace(item)) + " is not prefix=percent")
		case name == "":
			return sp, errors.New("group " + strconv.Quote(strings.TrimSpace(item)) + " has an empty pod-name prefix")
		case sp.has(name):
			return sp, errors.New("prefix " + strconv.Quote(name) + " is listed twice")
		case sp.n == maxGroups:
			return sp, errors.New("more than " + strconv.Itoa(maxGroups) + " groups")
		}
		p, err := strconv.ParseUint(strings.TrimSpace(strings.TrimSuffix(pct, "%")), 10, 8)
		if err != nil || p > 100 {
			return sp, errors.New("percentage " + strconv.Quote(pct) + " of " + strconv.Quote(name) + " is not an integer from 0 to 100")
		}
		if total += p; total > 100 {
			return sp, errors.New("percentages add up to more than 100")
		}
		sp.prefix[sp.n], sp.percent[sp.n] = name, p
		sp.n++
	}
	sp.percent[sp.n] = 100 - total
	return sp, nil
}

// has reports whether prefix is one of the named groups.
func (sp *split) has(prefix string) bool {
	for _, p := range sp.prefix[:sp.n] {
		if p == prefix {
			return true
		}
	}
	return false
}

// groupOf returns the group of a pod: the named group with the longest
// prefix of its name, or n (the rest) when none matches.
func (sp *split) groupOf(pod string) int {
	best, bestLen := sp.n, 0
	for g, p := range sp.prefix[:sp.n] {
		if len(p) > bestLen && strings.HasPrefix(pod, p) {
			best, bestLen = g, len(p)
		}
	}
	return best
}
