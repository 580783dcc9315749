package main

import (
	"testing"

	"github.com/weirproxy/weir/plugins/internal/examples"
	"github.com/weirproxy/weir/sdk/abi"
)

// BenchmarkProcess runs the plugin natively on a full sync of 10k services
// whose endpoints have different active connections: every service is
// re-weighted.
func BenchmarkProcess(b *testing.B) {
	examples.ProcessSignals(b, plugin, "null", func(i, j int) abi.Signals {
		return abi.Signals{Active: uint32((i + 3*j) % 17), New: uint32(j)}
	})
}

// BenchmarkProcessIdle runs it on the same batch with no connections: every
// service passes unchanged.
func BenchmarkProcessIdle(b *testing.B) {
	examples.ProcessSignals(b, plugin, "null", func(int, int) abi.Signals { return abi.Signals{} })
}
