package soak

import (
	"os"
	"path/filepath"
	"testing"
)

// TestCountListening counts the LISTEN sockets of a /proc/net/tcp table
// in the node-port range only.
func TestCountListening(t *testing.T) {
	table := `  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000:7A1D 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1 0000000000000000 100 0 0 10 0
   1: 0100007F:2819 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 2 1 0000000000000000 100 0 0 10 0
   2: 0B00F40A:7A1E 0200A8C0:9C40 01 00000000:00000000 00:00000000 00000000     0        0 3 1 0000000000000000 20 4 30 10 -1
   3: 00000000:7FFF 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4 1 0000000000000000 100 0 0 10 0
`
	path := filepath.Join(t.TempDir(), "tcp")
	if err := os.WriteFile(path, []byte(table), 0o644); err != nil {
		t.Fatal(err)
	}
	// 0x7A1D = 31261 listening, 0x2819 = 10265 out of range, 0x7A1E
	// established, 0x7FFF = 32767 listening.
	if n, err := countListening(path, 30000, 32767); err != nil || n != 2 {
		t.Errorf("countListening = %d, %v; want 2", n, err)
	}
}
