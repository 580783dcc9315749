// Package diagnose explains on a node why a Service works or does not:
// findings about the object, its endpoints, the plugins, the kernel's rules
// and the node itself, each a plain sentence with a stable code.
package diagnose

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
)

// Severity says how much a finding matters to traffic.
type Severity int

// The severities, from harmless to traffic lost.
const (
	// Info is a fact worth knowing that loses no traffic.
	Info Severity = iota
	// Warning is a setting or state that may lose traffic in some cases,
	// or that an operator may not expect.
	Warning
	// Broken means traffic is lost, or the kernel differs from the plan.
	Broken
)

var severityNames = [...]string{Info: "info", Warning: "warning", Broken: "broken"}

// String returns the severity's name: info, warning or broken.
func (s Severity) String() string {
	if int(s) < len(severityNames) {
		return severityNames[s]
	}
	return fmt.Sprintf("severity(%d)", int(s))
}

// MarshalText writes the severity's name, for JSON.
func (s Severity) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// UnmarshalText reads a severity's name.
func (s *Severity) UnmarshalText(b []byte) error {
	i := slices.Index(severityNames[:], string(b))
	if i < 0 {
		return fmt.Errorf("unknown severity %q", b)
	}
	*s = Severity(i)
	return nil
}

// Finding is one thing diagnose found.
type Finding struct {
	// Code is stable across releases, for tools: "area.what", for example
	// "endpoints.none-ready" or "node.ip-forward-off".
	Code     string   `json:"code"`
	Severity Severity `json:"severity"`
	// Subject is what the finding is about: a service port
	// (namespace/name:port/protocol), a service, or "node".
	Subject string `json:"subject"`
	// Message is a plain sentence for a person.
	Message string `json:"message"`
}

// String formats the finding as one line of the text report.
func (f Finding) String() string {
	return fmt.Sprintf("%-7s %s: %s [%s]", f.Severity, f.Subject, f.Message, f.Code)
}

// Report is everything one diagnose run found.
type Report struct {
	// Mode is the proxy mode diagnosed: nftables, iptables or ipvs.
	Mode string `json:"mode"`
	// From says where the state came from: "daemon" (the running weir's
	// debug endpoint) or "source" (computed by this command).
	From     string    `json:"from"`
	Findings []Finding `json:"findings"`
}

// Add appends findings to the report.
func (r *Report) Add(fs ...Finding) { r.Findings = append(r.Findings, fs...) }

// Broken reports whether a finding says traffic is lost or the kernel
// differs from the plan: diagnose then exits 1.
func (r *Report) Broken() bool {
	return slices.ContainsFunc(r.Findings, func(f Finding) bool { return f.Severity == Broken })
}

// Worst returns the highest severity among the findings, Info when there
// are none.
func (r *Report) Worst() Severity {
	worst := Info
	for _, f := range r.Findings {
		worst = max(worst, f.Severity)
	}
	return worst
}

// WriteText prints the findings one per line, grouped by subject in the
// order they were added, and a verdict line.
func (r *Report) WriteText(w io.Writer) error {
	var b strings.Builder
	for _, f := range r.Findings {
		b.WriteString(f.String())
		b.WriteByte('\n')
	}
	switch {
	case r.Broken():
		fmt.Fprintf(&b, "%s: traffic is lost or the kernel differs from the plan (%s)\n", r.Mode, r.counts())
	case len(r.Findings) == 0:
		fmt.Fprintf(&b, "%s: nothing found\n", r.Mode)
	default:
		fmt.Fprintf(&b, "%s: nothing loses traffic (%s)\n", r.Mode, r.counts())
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// WriteJSON prints the report as indented JSON.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	out := *r
	if out.Findings == nil {
		out.Findings = []Finding{}
	}
	return enc.Encode(out)
}

func (r *Report) counts() string {
	var n [len(severityNames)]int
	for _, f := range r.Findings {
		n[f.Severity]++
	}
	var parts []string
	for s := Broken; s >= Info; s-- {
		if n[s] > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", n[s], s))
		}
	}
	return strings.Join(parts, ", ")
}
