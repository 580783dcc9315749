package sysctl

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestSetWritesOnlyChanges(t *testing.T) {
	root := t.TempDir()
	t.Setenv(RootEnv, root)
	path := filepath.Join(root, "net/ipv4/ip_forward")
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	// The kernel lists values with a newline; a write would drop it.
	if err := os.WriteFile(path, []byte("1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := Set(0, "net/ipv4/ip_forward", "1"); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(path); string(got) != "1\n" {
		t.Errorf("an equal value was written: file holds %q", got)
	}
	if err := Set(0, "net/ipv4/ip_forward", "0"); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(path); string(got) != "0" {
		t.Errorf("file holds %q, want 0", got)
	}
	err := Set(0, "net/ipv4/vs/conntrack", "1")
	if err == nil || !strings.Contains(err.Error(), "net/ipv4/vs/conntrack=1") {
		t.Errorf("missing key: error %v does not name the key and value", err)
	}
}
