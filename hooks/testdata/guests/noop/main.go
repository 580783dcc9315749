// Command noop is a test plugin that returns every batch unchanged, for
// measuring the cost of the sandbox itself.
package main

import (
	"github.com/weirproxy/weir/sdk/abi"
	"github.com/weirproxy/weir/sdk/guest"
)

func init() {
	guest.Register(guest.Plugin{Process: func(*abi.Batch) error { return nil }})
}

func main() {}
