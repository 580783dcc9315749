package main

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/registry"

	"github.com/weirproxy/weir/hooks/oci"
)

// TestPluginPush pushes a signed plugin with weir plugin push and pulls it
// back, checking the signature with the public key.
func TestPluginPush(t *testing.T) {
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer srv.Close()
	dir := t.TempDir()
	wasm := []byte("\x00asm\x01\x00\x00\x00")
	file := filepath.Join(dir, "p.wasm")
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, _ := x509.MarshalECPrivateKey(key)
	keyFile := filepath.Join(dir, "sign.pem")
	if err := os.WriteFile(file, wasm, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	location := oci.Scheme + strings.TrimPrefix(srv.URL, "http://") + "/plugins/p:v1"
	var stdout, stderr bytes.Buffer
	if code := run([]string{"plugin", "push", file, location, "--sign-key", keyFile, "--docker-config", ""}, &stdout, &stderr); code != 0 {
		t.Fatalf("weir plugin push exited %d: %s", code, stderr.String())
	}
	if !strings.Contains(stdout.String(), "signed sha256:") {
		t.Errorf("output %q does not say it signed", stdout.String())
	}
	ref, _ := oci.Parse(location)
	c := &oci.Client{PublicKey: &key.PublicKey}
	digest, err := c.Resolve(context.Background(), ref)
	if err != nil {
		t.Fatal(err)
	}
	a, err := c.Pull(context.Background(), ref, digest)
	if err != nil || !bytes.Equal(a.Wasm, wasm) {
		t.Fatalf("pull of the pushed plugin: %v", err)
	}
	if !strings.Contains(stdout.String(), "pinned "+oci.Scheme+ref.Repository()+"@"+digest) {
		t.Errorf("output %q does not give the pinned location", stdout.String())
	}

	stdout.Reset()
	stderr.Reset()
	if code := run([]string{"plugin", "push", file}, &stdout, &stderr); code != exitUsage {
		t.Errorf("push without a location exited %d, want %d", code, exitUsage)
	}
}
