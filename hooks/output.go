package hooks

import (
	"bytes"
	"log/slog"
)

// Limits on what a plugin may write to stdout and stderr.
const (
	outputPerCall = 4096
	outputPerLine = 512
)

// output collects one instance's stdout and stderr and logs them line by
// line, tagged with the plugin's name. A budget shared by both streams caps
// each call; begin starts a call and end flushes it. Writes come from the
// goroutine running the instance, so output needs no lock.
type output struct {
	log       *slog.Logger
	plugin    string
	budget    int
	truncated bool
	firstErr  string // the call's first stderr line, for error messages
	stdout    stream
	stderr    stream
}

// stream is one of the two writers an instance sees.
type stream struct {
	o    *output
	name string
	line []byte
}

func newOutput(log *slog.Logger, plugin string) *output {
	o := &output{log: log, plugin: plugin, budget: outputPerCall}
	o.stdout = stream{o: o, name: "stdout"}
	o.stderr = stream{o: o, name: "stderr"}
	return o
}

// begin starts a call with a fresh budget.
func (o *output) begin() {
	o.budget, o.truncated, o.firstErr = outputPerCall, false, ""
}

// end logs the call's unfinished lines and, once, that output was cut.
func (o *output) end() {
	o.stdout.flush()
	o.stderr.flush()
	if o.truncated {
		o.log.Warn("Plugin output truncated", "plugin", o.plugin,
			"limit", "4 KiB per call, 512 bytes per line")
		o.truncated = false
	}
}

// Write logs complete lines and keeps a partial one; it never fails, so a
// chatty plugin does not see errors from its writes.
func (s *stream) Write(p []byte) (int, error) {
	n := len(p)
	o := s.o
	if len(p) > o.budget {
		p = p[:o.budget]
		o.truncated = true
	}
	o.budget -= len(p)
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		chunk := p
		if i >= 0 {
			chunk = p[:i]
		}
		room := outputPerLine - len(s.line)
		if len(chunk) > room {
			chunk = chunk[:room]
			o.truncated = true
		}
		s.line = append(s.line, chunk...)
		if i < 0 {
			break
		}
		s.flush()
		p = p[i+1:]
	}
	return n, nil
}

// flush logs the stream's pending line, if any.
func (s *stream) flush() {
	if len(s.line) == 0 {
		return
	}
	line := string(bytes.TrimRight(s.line, "\r"))
	s.line = s.line[:0]
	if s.name == "stderr" && s.o.firstErr == "" {
		s.o.firstErr = line
	}
	s.o.log.Info("Plugin output", "plugin", s.o.plugin, "stream", s.name, "line", line)
}
