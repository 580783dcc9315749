package main

import (
	"testing"

	"github.com/weirproxy/weir/plugins/internal/examples"
)

// BenchmarkProcess runs the plugin natively on a full sync of 10k services.
func BenchmarkProcess(b *testing.B) { examples.Process(b, plugin, `{"patterns":["pool-1-*"]}`) }
