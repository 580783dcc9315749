// Command signals is a test plugin for live signals: it refuses batches
// without them (version 1), and gives every endpoint the weight 1 plus its
// active connections, so that only a change of Active changes its output.
package main

import (
	"errors"

	"github.com/weirproxy/weir/sdk/abi"
	"github.com/weirproxy/weir/sdk/guest"
)

func init() { guest.Register(guest.Plugin{Process: process}) }

func main() {}

func process(b *abi.Batch) error {
	if b.Version() != abi.Version2 {
		return errors.New("a batch without signals")
	}
	for i := range b.Len() {
		s := b.Service(i)
		for j := range s.Len() {
			e := s.Endpoint(j)
			e.SetWeight(1 + e.Active())
		}
	}
	return nil
}
