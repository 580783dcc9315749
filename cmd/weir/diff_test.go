package main

import (
	"strings"
	"testing"
)

func TestLineDiff(t *testing.T) {
	tests := []struct{ a, b, want string }{
		{"", "", ""},
		{"x y", "x y", " x  y"},
		{"x", "", "-x"},
		{"", "x", "+x"},
		{"s e1 e2 e3", "s e1 e3", " s  e1 -e2  e3"},
		{"s e1 e2", "s f1 f2", " s -e1 -e2 +f1 +f2"},
		{"a b c", "c b a", "-a -b  c +b +a"},
	}
	for _, tc := range tests {
		var got []string
		for _, l := range lineDiff(strings.Fields(tc.a), strings.Fields(tc.b)) {
			got = append(got, string(l.op)+l.text)
		}
		if g := strings.Join(got, " "); g != tc.want {
			t.Errorf("lineDiff(%q, %q) = %q, want %q", tc.a, tc.b, g, tc.want)
		}
	}
}
