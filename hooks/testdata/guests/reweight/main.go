// Command reweight is a well-behaved test plugin: it gives every endpoint of
// a service annotated with its annotation the weight the annotation names.
package main

import (
	"fmt"
	"strconv"

	"github.com/weirproxy/weir/sdk/abi"
	"github.com/weirproxy/weir/sdk/guest"
)

var annotation = "reweight.weir.dev/weight"

func init() { guest.Register(guest.Plugin{Configure: configure, Process: process}) }

func main() {}

func configure(config []byte) error {
	var c struct {
		Annotation string `json:"annotation"`
	}
	if err := guest.DecodeConfig(config, &c); err != nil {
		return err
	}
	if c.Annotation != "" {
		annotation = c.Annotation
	}
	return nil
}

func process(b *abi.Batch) error {
	for i := range b.Len() {
		s := b.Service(i)
		v, ok := s.Annotation(annotation)
		if !ok {
			continue
		}
		w, err := strconv.ParseUint(v, 10, 32)
		if err != nil {
			return fmt.Errorf("%s: annotation %s: %q is not a weight", s.Key(), annotation, v)
		}
		for j := range s.Len() {
			s.Endpoint(j).SetWeight(uint32(w))
		}
	}
	return nil
}
