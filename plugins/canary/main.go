// Command canary is a Weir hook plugin that splits a service's new
// connections between groups of endpoints chosen by pod-name prefix, in the
// percentages a Service annotation gives, e.g.
//
//	canary.weir.dev/split: "web-canary=10"
//
// It only re-weights endpoints; see README.md for the exact rules.
package main

import (
	"errors"
	"io"
	"os"
	"strconv"
	"strings"

	"github.com/weirproxy/weir/sdk/abi"
	"github.com/weirproxy/weir/sdk/guest"
)

// defaultAnnotation is the Service annotation that holds the split.
const defaultAnnotation = "canary.weir.dev/split"

// config is the plugin's configuration as Weir hands it over.
type config struct {
	// Annotation overrides the annotation key that holds the split.
	Annotation string `json:"annotation"`
}

var (
	// annotation is the configured annotation key.
	annotation = defaultAnnotation
	// logOut receives one line per service whose annotation is rejected.
	logOut io.Writer = os.Stderr
	// plugin is what init registers; tests run it through sdktest.
	plugin = guest.Plugin{Configure: configure, Process: process}
)

func init() { guest.Register(plugin) }

func main() {}

// configure parses the configuration; with none the defaults apply.
func configure(raw []byte) error {
	c := config{Annotation: defaultAnnotation}
	if err := guest.DecodeConfig(raw, &c); err != nil {
		return err
	}
	if strings.TrimSpace(c.Annotation) == "" {
		return errors.New("annotation: must not be empty")
	}
	annotation = c.Annotation
	return nil
}

// process re-weights the endpoints of every service that carries a valid
// split annotation; a service with an invalid one is left unchanged.
func process(b *abi.Batch) error {
	for i := range b.Len() {
		s := b.Service(i)
		v, ok := s.Annotation(annotation)
		if !ok || strings.TrimSpace(v) == "" {
			continue
		}
		sp, err := parseSplit(v)
		if err != nil {
			warn(s, "annotation "+annotation+"="+quote(v)+": "+err.Error()+"; service left unchanged")
			continue
		}
		apply(s, &sp)
	}
	return nil
}

// warn writes one line about service s to the plugin's log.
func warn(s abi.Service, msg string) {
	_, _ = io.WriteString(logOut, s.Key().String()+": "+msg+"\n")
}

// quote quotes an annotation value for the log, cut to 64 bytes so that the
// line stays under Weir's 512-byte limit.
func quote(v string) string {
	if len(v) > 64 {
		return strconv.Quote(v[:64]) + "..."
	}
	return strconv.Quote(v)
}
