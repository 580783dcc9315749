// Command benign is the soak's well-behaved guest for the victim plugin
// slots: it accepts any configuration (the slots' config names the mode
// the hostile guest replacing it will use) and returns every batch
// unchanged.
package main

import (
	"github.com/weirproxy/weir/sdk/abi"
	"github.com/weirproxy/weir/sdk/guest"
)

func init() {
	guest.Register(guest.Plugin{
		Configure: func([]byte) error { return nil },
		Process:   func(*abi.Batch) error { return nil },
	})
}

func main() {}
