package main

import (
	"testing"

	"github.com/weirproxy/weir/plugins/internal/bench"
)

// BenchmarkProcess runs the plugin natively on a full sync of 10k services.
func BenchmarkProcess(b *testing.B) { bench.Process(b, plugin, "null") }
