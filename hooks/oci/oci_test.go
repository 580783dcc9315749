package oci

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

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		in, repo, tag, digest, err string
	}{
		{in: "oci://ghcr.io/acme/zone:v1", repo: "ghcr.io/acme/zone", tag: "v1"},
		{in: "oci://localhost:5000/p@sha256:" + strings.Repeat("a", 64), repo: "localhost:5000/p", digest: "sha256:" + strings.Repeat("a", 64)},
		{in: "oci://ghcr.io/acme/zone", err: "names no tag or digest"},
		{in: "oci://acme/zone:v1", err: "names no registry"},
		{in: "oci://zone:v1", err: "names no registry"},
		{in: "oci://ghcr.io/Acme/zone:v1", err: "repository"},
		{in: "oci://ghcr.io/acme/zone@sha256:abc", err: "digest"},
		{in: "ghcr.io/acme/zone:v1", err: "does not start with oci://"},
	} {
		r, err := Parse(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) || !strings.Contains(err.Error(), tc.in) {
				t.Errorf("Parse(%q) err = %v, want one naming it and containing %q", tc.in, err, tc.err)
			}
			continue
		}
		if err != nil || r.Repository() != tc.repo || r.tag != tc.tag || r.digest != tc.digest || r.String() != tc.in {
			t.Errorf("Parse(%q) = %+v, %v; want repo %s tag %q digest %q", tc.in, r, err, tc.repo, tc.tag, tc.digest)
		}
	}
}

// TestPayloadIsCosigns checks the signed payload against the bytes cosign
// writes for the same image.
func TestPayloadIsCosigns(t *testing.T) {
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	digest := "sha256:" + strings.Repeat("0", 64)
	sig, err := Sign(key, "ghcr.io/acme/zone", digest)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"critical":{"identity":{"docker-reference":"ghcr.io/acme/zone"},"image":{"docker-manifest-digest":"` +
		digest + `"},"type":"cosign container image signature"},"optional":null}`
	if string(sig.Payload) != want {
		t.Errorf("payload\n%s\nwant\n%s", sig.Payload, want)
	}
	if err := sig.check(&key.PublicKey, digest); err != nil {
		t.Errorf("check: %v", err)
	}
	if err := sig.check(&key.PublicKey, "sha256:"+strings.Repeat("1", 64)); err == nil {
		t.Errorf("a payload naming another digest passed")
	}
	sig.Payload = bytes.Replace(sig.Payload, []byte("acme"), []byte("acmf"), 1)
	if err := sig.check(&key.PublicKey, digest); err == nil || !strings.Contains(err.Error(), "does not verify") {
		t.Errorf("an altered payload: err = %v", err)
	}
}

func TestLoadKeys(t *testing.T) {
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	dir := t.TempDir()
	write := func(name, typ string, der []byte) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	pkcs8, _ := x509.MarshalPKCS8PrivateKey(key)
	sec1, _ := x509.MarshalECPrivateKey(key)
	pub, _ := x509.MarshalPKIXPublicKey(&key.PublicKey)
	for _, path := range []string{write("pkcs8.key", "PRIVATE KEY", pkcs8), write("sec1.key", "EC PRIVATE KEY", sec1)} {
		if got, err := LoadPrivateKey(path); err != nil || !got.Equal(key) {
			t.Errorf("LoadPrivateKey(%s) = %v", path, err)
		}
	}
	if _, err := LoadPrivateKey(write("cosign.key", "ENCRYPTED SIGSTORE PRIVATE KEY", []byte("x"))); err == nil ||
		!strings.Contains(err.Error(), "encrypted") {
		t.Errorf("an encrypted cosign key: err = %v", err)
	}
	if got, err := LoadPublicKey(write("cosign.pub", "PUBLIC KEY", pub)); err != nil || !got.Equal(&key.PublicKey) {
		t.Errorf("LoadPublicKey = %v", err)
	}
	p384, _ := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	pub384, _ := x509.MarshalPKIXPublicKey(&p384.PublicKey)
	if _, err := LoadPublicKey(write("p384.pub", "PUBLIC KEY", pub384)); err == nil || !strings.Contains(err.Error(), "P-256") {
		t.Errorf("a P-384 key: err = %v", err)
	}
}

func TestRegistryHost(t *testing.T) {
	for in, want := range map[string]string{
		"https://index.docker.io/v1/": "index.docker.io",
		"docker.io":                   "index.docker.io",
		"ghcr.io":                     "ghcr.io",
		"http://127.0.0.1:5000":       "127.0.0.1:5000",
		"https://quay.io/v2/x":        "quay.io",
	} {
		if got := registryHost(in); got != want {
			t.Errorf("registryHost(%q) = %q, want %q", in, got, want)
		}
	}
}

// serve starts go-containerregistry's registry on loopback and returns
// its host.
func serve(t *testing.T) string {
	t.Helper()
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

// TestPullRefusesOtherArtifacts pulls a container image: not a plugin.
func TestPullRefusesOtherArtifacts(t *testing.T) {
	host := serve(t)
	img, err := random.Image(64, 1)
	if err != nil {
		t.Fatal(err)
	}
	img = mutate.MediaType(img, types.OCIManifestSchema1)
	tag, _ := name.NewTag(host + "/images/app:v1")
	if err := remote.Write(tag, img); err != nil {
		t.Fatal(err)
	}
	r, _ := Parse(Scheme + host + "/images/app:v1")
	c := &Client{}
	digest, err := c.Resolve(context.Background(), r)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Pull(context.Background(), r, digest); err == nil || !strings.Contains(err.Error(), "not a Weir plugin") {
		t.Errorf("Pull of a container image: err = %v", err)
	}
}

// TestCacheDamaged damages a cached wasm: the next pull is a miss and
// fetches it again.
func TestCacheDamaged(t *testing.T) {
	host := serve(t)
	r, _ := Parse(Scheme + host + "/plugins/p:v1")
	c := &Client{CacheDir: t.TempDir(), Keychain: authn.NewMultiKeychain()}
	wasm := []byte("\x00asm\x01\x00\x00\x00")
	digest, err := c.Push(context.Background(), r, wasm, "p.wasm", nil)
	if err != nil {
		t.Fatal(err)
	}
	if a, err := c.Pull(context.Background(), r, digest); err != nil || a.Cached || !bytes.Equal(a.Wasm, wasm) {
		t.Fatalf("first pull: %+v, %v", a, err)
	}
	if a, err := c.Pull(context.Background(), r, digest); err != nil || !a.Cached {
		t.Fatalf("second pull: %+v, %v; want it from the cache", a, err)
	}
	path := filepath.Join(c.CacheDir, "sha256", strings.TrimPrefix(digest, "sha256:"), "plugin.wasm")
	if err := os.WriteFile(path, []byte("damaged"), 0o600); err != nil {
		t.Fatal(err)
	}
	if a, err := c.Pull(context.Background(), r, digest); err != nil || a.Cached || !bytes.Equal(a.Wasm, wasm) {
		t.Errorf("pull after damage: %+v, %v; want it from the registry", a, err)
	}
}
