package hooks

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"io"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/registry"

	"github.com/weirproxy/weir/hooks/oci"
)

// testRegistry is go-containerregistry's registry on loopback. With a user
// set it asks for basic auth; with down set it answers 503; with hang set
// it answers nothing until the client gives up.
type testRegistry struct {
	srv        *httptest.Server
	user, pass string
	down, hang atomic.Bool
	requests   atomic.Int64
}

func startRegistry(t *testing.T, user, pass string) *testRegistry {
	t.Helper()
	r := &testRegistry{user: user, pass: pass}
	h := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.requests.Add(1)
		if r.hang.Load() {
			<-req.Context().Done()
			return
		}
		if r.down.Load() {
			http.Error(w, "down for the test", http.StatusServiceUnavailable)
			return
		}
		if u, p, ok := req.BasicAuth(); r.user != "" && (!ok || u != r.user || p != r.pass) {
			w.Header().Set("WWW-Authenticate", `Basic realm="test"`)
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		h.ServeHTTP(w, req)
	}))
	t.Cleanup(r.srv.Close)
	return r
}

// location returns the oci:// location of repo at suffix (":tag" or "@digest").
func (r *testRegistry) location(repo, suffix string) string {
	return oci.Scheme + strings.TrimPrefix(r.srv.URL, "http://") + "/" + repo + suffix
}

// push pushes the named test guest to location, signed with key unless it
// is nil, and returns the manifest digest.
func push(t *testing.T, client *oci.Client, location, guestName string, key *ecdsa.PrivateKey) string {
	t.Helper()
	ref, err := oci.Parse(location)
	if err != nil {
		t.Fatal(err)
	}
	digest, err := client.Push(context.Background(), ref, readGuest(t, guestName), guestName+".wasm", key)
	if err != nil {
		t.Fatalf("push %s: %v", location, err)
	}
	return digest
}

// newKey returns a fresh P-256 key and the path of its PEM public key.
func newKey(t *testing.T) (*ecdsa.PrivateKey, string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "cosign.pub")
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return key, path
}

// loadedSHA returns the sha256 of the named plugin's loaded version, "" when none is.
func loadedSHA(c *Chain, name string) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, s := range c.slots {
		if s.Name == name && s.p != nil {
			return s.p.sha
		}
	}
	return ""
}

func TestOCILoadByTagAndDigest(t *testing.T) {
	reg := startRegistry(t, "", "")
	digest := push(t, &oci.Client{}, reg.location("plugins/noop", ":v1"), "noop", nil)
	for _, loc := range []string{reg.location("plugins/noop", ":v1"), reg.location("plugins/noop", "@"+digest)} {
		c, logs := newChain(t, Options{CacheDir: t.TempDir()}, Config{Name: "p", Path: loc, FailurePolicy: PolicyClosed})
		if got, want := loadedSHA(c, "p"), fileSHA(t, guest("noop")); got != want {
			t.Errorf("%s: loaded sha256 %q, want the pushed file's %s", loc, got, want)
		}
		if len(logs.lines("Pulled plugin", "plugin=p", "digest="+digest)) != 1 {
			t.Errorf("%s: the pull was not logged with digest %s", loc, digest)
		}
	}
}

// TestOCICache loads a signed plugin by digest and by tag, then again
// with the registry gone: both come from the cache, the signature too.
func TestOCICache(t *testing.T) {
	reg := startRegistry(t, "", "")
	key, pub := newKey(t)
	tag := reg.location("plugins/noop", ":v1")
	digest := push(t, &oci.Client{}, tag, "noop", key)
	byDigest := reg.location("plugins/noop", "@"+digest)
	cache := t.TempDir()
	load := func(locs ...string) {
		t.Helper()
		for _, loc := range locs {
			c, err := New(context.Background(), []Config{{Name: "p", Path: loc, PublicKey: pub, FailurePolicy: PolicyClosed}},
				Options{CacheDir: cache, Log: discard()})
			if err != nil {
				t.Fatalf("%s: %v", loc, err)
			}
			if got := loadedSHA(c, "p"); got != fileSHA(t, guest("noop")) {
				t.Errorf("%s: loaded sha256 %q", loc, got)
			}
			_ = c.Close(context.Background())
		}
	}
	load(byDigest, tag)
	if _, err := os.Stat(filepath.Join(cache, "oci", "sha256", strings.TrimPrefix(digest, "sha256:"), "plugin.wasm")); err != nil {
		t.Fatalf("the artifact is not cached by digest: %v", err)
	}
	reg.down.Store(true)
	before := reg.requests.Load()
	load(byDigest)
	if n := reg.requests.Load() - before; n != 0 {
		t.Errorf("loading by digest from the cache reached the registry %d times", n)
	}
	load(tag) // the tag cannot be resolved: the digest it last named loads
}

// TestOCIHangingRegistryAtStart loads a cached tag while the registry
// accepts connections but never answers: the resolve gives up after
// startResolveTimeout and the cached version loads, instead of the start
// waiting for pullTimeout; an open plugin never pulled gives up as soon
// and is reported as not loaded.
func TestOCIHangingRegistryAtStart(t *testing.T) {
	reg := startRegistry(t, "", "")
	tag := reg.location("plugins/noop", ":v1")
	push(t, &oci.Client{}, tag, "noop", nil)
	cache := t.TempDir()
	load := func() time.Duration {
		t.Helper()
		start := time.Now()
		c, err := New(context.Background(), []Config{{Name: "p", Path: tag, FailurePolicy: PolicyClosed}},
			Options{CacheDir: cache, Log: discard()})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close(context.Background())
		if got := loadedSHA(c, "p"); got != fileSHA(t, guest("noop")) {
			t.Errorf("loaded sha256 %q, want the cached noop", got)
		}
		return time.Since(start)
	}
	load()
	old := startResolveTimeout
	startResolveTimeout = 300 * time.Millisecond
	t.Cleanup(func() { startResolveTimeout = old })
	reg.hang.Store(true)
	if took := load(); took > 20*time.Second {
		t.Errorf("loading the cached tag from a hanging registry took %v, want about %v", took, startResolveTimeout)
	}
	start := time.Now()
	c, err := New(context.Background(), []Config{{Name: "q", Path: reg.location("plugins/other", ":v1"), FailurePolicy: PolicyOpen}},
		Options{CacheDir: cache, Log: discard()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.Background())
	if took, failed := time.Since(start), c.LoadFailures(); took > 20*time.Second || len(failed) != 1 {
		t.Errorf("an uncached tag from a hanging registry: New took %v, load failures %v; want a few seconds and q not loaded", took, failed)
	}
}

func discard() *slog.Logger { return slog.New(slog.DiscardHandler) }

func TestOCISignatures(t *testing.T) {
	reg := startRegistry(t, "", "")
	key, pub := newKey(t)
	other, _ := newKey(t)
	client := &oci.Client{}
	signed := push(t, client, reg.location("plugins/signed", ":v1"), "noop", key)
	push(t, client, reg.location("plugins/unsigned", ":v1"), "noop", nil)
	push(t, client, reg.location("plugins/other", ":v1"), "noop", other)
	// A signature by the right key, of a payload naming another digest.
	wrong := push(t, client, reg.location("plugins/wrong", ":v1"), "reweight", nil)
	sig, err := oci.Sign(key, "plugins/wrong", signed)
	if err != nil {
		t.Fatal(err)
	}
	ref, _ := oci.Parse(reg.location("plugins/wrong", ":v1"))
	if err := client.PushSignature(context.Background(), ref, wrong, sig); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ repo, want string }{
		{"plugins/signed", ""},
		{"plugins/unsigned", "has no signature"},
		{"plugins/other", "does not verify with the configured public key"},
		{"plugins/wrong", "the signed payload names manifest " + signed + ", not " + wrong},
	} {
		loc := reg.location(tc.repo, ":v1")
		c, err := New(context.Background(), []Config{{Name: "p", Path: loc, PublicKey: pub, FailurePolicy: PolicyClosed}},
			Options{CacheDir: t.TempDir(), Log: discard()})
		if tc.want == "" {
			if err != nil {
				t.Errorf("%s: %v", tc.repo, err)
			} else {
				_ = c.Close(context.Background())
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), `plugin "p": `+loc) {
			t.Errorf("%s: New err = %v, want one naming the plugin, %s and %q", tc.repo, err, loc, tc.want)
		}
		if err == nil {
			_ = c.Close(context.Background())
		}
	}
}

// TestOCIUnsignedOpen shows that an open plugin does not load unsigned
// either: its services pass through.
func TestOCIUnsignedOpen(t *testing.T) {
	reg := startRegistry(t, "", "")
	_, pub := newKey(t)
	loc := reg.location("plugins/reweight", ":v1")
	push(t, &oci.Client{}, loc, "reweight", nil)
	c, logs := newChain(t, Options{CacheDir: t.TempDir()}, Config{Name: "p", Path: loc, PublicKey: pub})
	if sha := loadedSHA(c, "p"); sha != "" {
		t.Fatalf("an unsigned plugin loaded: %s", sha)
	}
	if w := weightsAfter(t, c, svc("default", "alpha", 1, weightAnnotation, "5")); !slices.Equal(w, []uint32{1}) {
		t.Errorf("weights %v, want the input's", w)
	}
	if len(logs.lines("level=ERROR", "plugin=p", "no signature")) == 0 {
		t.Errorf("the refusal was not logged")
	}
}

// registryEvents records a chain's failed pulls.
type registryEvents struct{ failed chan error }

func (registryEvents) PluginCalled(string, time.Duration, error) {}
func (registryEvents) PluginQuarantined(string, bool)            {}
func (e registryEvents) PluginPullFailed(_ string, err error) {
	select {
	case e.failed <- err:
	default:
	}
}

// watchedOCI starts a chain of one plugin at loc, refreshed every second,
// and its Watch.
func watchedOCI(t *testing.T, cfg Config) (*Chain, chan struct{}, chan error) {
	t.Helper()
	reloaded, failed := make(chan struct{}, 10), make(chan error, 1)
	cfg.RefreshInterval = time.Second
	c, _ := newChain(t, Options{CacheDir: t.TempDir(), Observer: registryEvents{failed},
		OnReload: func() { reloaded <- struct{}{} }}, cfg)
	watchInBackground(t, c)
	return c, reloaded, failed
}

// await waits for a value on ch, failing the test after a deadline.
func await[T any](t *testing.T, what string, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(30 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
		panic("unreachable")
	}
}

func TestOCITagMovedReloads(t *testing.T) {
	reg := startRegistry(t, "", "")
	key, pub := newKey(t)
	loc := reg.location("plugins/p", ":stable")
	push(t, &oci.Client{}, loc, "noop", key)
	c, reloaded, _ := watchedOCI(t, Config{Name: "p", Path: loc, PublicKey: pub, FailurePolicy: PolicyClosed})
	alpha := svc("default", "alpha", 2, weightAnnotation, "6")
	if w := weightsAfter(t, c, alpha); !slices.Equal(w, []uint32{1, 1}) {
		t.Fatalf("noop gave weights %v", w)
	}
	push(t, &oci.Client{}, loc, "reweight", key)
	await(t, "the reload after the tag moved", reloaded)
	if w := weightsAfter(t, c, alpha); !slices.Equal(w, []uint32{6, 6}) {
		t.Errorf("after the tag moved weights are %v, want the new version's 6s", w)
	}
}

// TestOCIMovedUnsignedKept moves the tag to an unsigned version: it is
// refused and the signed one keeps serving.
func TestOCIMovedUnsignedKept(t *testing.T) {
	reg := startRegistry(t, "", "")
	key, pub := newKey(t)
	loc := reg.location("plugins/p", ":stable")
	push(t, &oci.Client{}, loc, "reweight", key)
	c, reloaded, failed := watchedOCI(t, Config{Name: "p", Path: loc, PublicKey: pub, FailurePolicy: PolicyClosed})
	push(t, &oci.Client{}, loc, "noop", nil)
	if err := await(t, "the refused pull", failed); !errors.Is(err, oci.ErrUnsigned) {
		t.Errorf("pull failed with %v, want ErrUnsigned", err)
	}
	if w := weightsAfter(t, c, svc("default", "alpha", 1, weightAnnotation, "3")); !slices.Equal(w, []uint32{3}) {
		t.Errorf("weights %v, want the signed version's 3", w)
	}
	if len(reloaded) > 0 {
		t.Errorf("OnReload was called for a refused version")
	}
}

func TestOCIFailedResolveKeepsPlugin(t *testing.T) {
	reg := startRegistry(t, "", "")
	loc := reg.location("plugins/p", ":stable")
	push(t, &oci.Client{}, loc, "reweight", nil)
	c, _, failed := watchedOCI(t, Config{Name: "p", Path: loc, FailurePolicy: PolicyClosed})
	sha := loadedSHA(c, "p")
	reg.down.Store(true)
	if err := await(t, "the failed resolve", failed); !strings.Contains(err.Error(), "resolve tag stable") {
		t.Errorf("the failure reported is %v", err)
	}
	if got := loadedSHA(c, "p"); got != sha {
		t.Errorf("after a failed resolve the plugin is %q, want %q", got, sha)
	}
	if w := weightsAfter(t, c, svc("default", "alpha", 1, weightAnnotation, "7")); !slices.Equal(w, []uint32{7}) {
		t.Errorf("weights %v, want the loaded version's 7", w)
	}
}

func TestOCIDockerConfigAuth(t *testing.T) {
	reg := startRegistry(t, "weir", "s3cret")
	auth := base64.StdEncoding.EncodeToString([]byte("weir:s3cret"))
	host := strings.TrimPrefix(reg.srv.URL, "http://")
	config := filepath.Join(t.TempDir(), ".dockerconfigjson")
	if err := os.WriteFile(config, []byte(`{"auths":{"`+host+`":{"auth":"`+auth+`"}}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	loc := reg.location("private/noop", ":v1")
	push(t, &oci.Client{Keychain: oci.DockerConfig{Path: config}}, loc, "noop", nil)

	c, _ := newChain(t, Options{CacheDir: t.TempDir()},
		Config{Name: "p", Path: loc, DockerConfig: config, FailurePolicy: PolicyClosed})
	if loadedSHA(c, "p") != fileSHA(t, guest("noop")) {
		t.Errorf("the plugin did not load with the docker config's credentials")
	}
	_, err := New(context.Background(), []Config{{Name: "p", Path: loc, FailurePolicy: PolicyClosed}},
		Options{CacheDir: t.TempDir(), Log: discard()})
	if err == nil || !strings.Contains(err.Error(), "UNAUTHORIZED") && !strings.Contains(err.Error(), "401") {
		t.Errorf("without credentials New err = %v, want an authorization failure", err)
	}
}
