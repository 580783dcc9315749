package hooks

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/weirproxy/weir/sdk/plan"
)

func fileSHA(t testing.TB, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
}

// newErr runs New expecting it to fail and returns the error's text.
func newErr(t *testing.T, plugins ...Config) string {
	t.Helper()
	log, _ := testLog(t)
	c, err := New(context.Background(), plugins, Options{CacheDir: cacheDir, Log: log})
	if err == nil {
		_ = c.Close(context.Background())
		t.Fatalf("New succeeded, want an error")
	}
	return err.Error()
}

func TestLoadPinned(t *testing.T) {
	path := guest("noop")
	sum := fileSHA(t, path)
	newChain(t, Options{}, Config{Name: "noop", Path: path, SHA256: strings.ToUpper(sum), FailurePolicy: PolicyClosed})

	wrong := strings.Repeat("ab", 32)
	got := newErr(t, Config{Name: "noop", Path: path, SHA256: wrong, FailurePolicy: PolicyClosed})
	want := `plugin "noop": sha256 of ` + path + " is " + sum + ", config pins " + wrong
	if got != want {
		t.Errorf("New returned\n%s\nwant\n%s", got, want)
	}
}

func TestLoadABIVersion(t *testing.T) {
	got := newErr(t, Config{Name: "v2", Path: guest("abiv2"), FailurePolicy: PolicyClosed})
	want := `plugin "v2": ` + guest("abiv2") + ": it speaks plugin ABI version 2, this Weir speaks version 1"
	if got != want {
		t.Errorf("New returned\n%s\nwant\n%s", got, want)
	}
}

func TestLoadFailure(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "missing.wasm")
	got := newErr(t, Config{Name: "gone", Path: missing, FailurePolicy: PolicyClosed})
	if !strings.Contains(got, `plugin "gone": open `+missing) {
		t.Errorf("New returned %q, want it to name the plugin and the file", got)
	}

	// An open plugin that cannot load is inactive: it passes services
	// through without errors, and says so once.
	c, logs := newChain(t, Options{},
		Config{Name: "gone", Path: missing},
		Config{Name: "reweight", Path: guest("reweight")})
	in := []*plan.Service{svc("default", "alpha", 2, weightAnnotation, "3")}
	for range 2 {
		out, err := apply(c, in, true)
		if err != nil {
			t.Fatalf("Apply: %v", err)
		}
		if !slices.Equal(weights(out[0]), []uint32{3, 3}) {
			t.Errorf("weights %v, want the later plugin's 3s", weights(out[0]))
		}
	}
	if n := len(logs.lines("level=ERROR", "plugin=gone")); n != 1 {
		t.Errorf("logged %d errors for the plugin, want 1", n)
	}
}

func TestLoadConfig(t *testing.T) {
	// The plugin gets its config as JSON.
	c, _ := newChain(t, Options{}, Config{Name: "reweight", Path: guest("reweight"),
		Config: map[string]any{"annotation": "example.com/w"}})
	out, err := apply(c, []*plan.Service{svc("default", "alpha", 2, "example.com/w", "9")}, true)
	if err != nil || !slices.Equal(weights(out[0]), []uint32{9, 9}) {
		t.Errorf("Apply returned weights %v, %v; want 9s from the configured annotation", weights(out[0]), err)
	}

	for _, tc := range []struct {
		name, guest string
		config      any
		want        string
	}{
		{"unknown field", "reweight", map[string]any{"annotatoin": "x"},
			`weir_configure returned status BadConfig (stderr: config: json: unknown field "annotatoin")`},
		{"config for a plugin without one", "noop", map[string]any{"x": 1},
			"weir_configure returned status BadConfig (stderr: config: this plugin takes no configuration)"},
		{"config that is no JSON", "noop", map[any]any{1: 2}, "config cannot be handed to the plugin as JSON"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := newErr(t, Config{Name: "p", Path: guest(tc.guest), Config: tc.config, FailurePolicy: PolicyClosed})
			if !strings.HasPrefix(got, `plugin "p": `) || !strings.Contains(got, tc.want) {
				t.Errorf("New returned %q, want %q", got, tc.want)
			}
		})
	}
}

func TestLoadBadSettings(t *testing.T) {
	ok := Config{Name: "p", Path: "/p.wasm"}
	for _, tc := range []struct {
		name string
		edit func(*Config)
		want string
	}{
		{"no name", func(c *Config) { c.Name = "" }, `plugin with path "/p.wasm" has no name`},
		{"no path", func(c *Config) { c.Path = "" }, `plugin "p": no path to a .wasm file`},
		{"bad sha256", func(c *Config) { c.SHA256 = "abc" }, `plugin "p": sha256 "abc" is not 64 hex digits`},
		{"bad policy", func(c *Config) { c.FailurePolicy = "ajar" },
			`plugin "p": failurePolicy "ajar" is neither "open" nor "closed"`},
		{"negative timeout", func(c *Config) { c.Timeout = -time.Second }, `plugin "p": timeout -1s is negative`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := ok
			tc.edit(&c)
			if got := newErr(t, c); got != tc.want {
				t.Errorf("New returned %q, want %q", got, tc.want)
			}
		})
	}
	if got := newErr(t, ok, ok); got != `plugin "p" is configured twice` {
		t.Errorf("New returned %q for a duplicate name", got)
	}
}

func TestLoadDefaults(t *testing.T) {
	s, err := check(Config{Name: "p", Path: "/p.wasm", MemoryLimit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	if s.FailurePolicy != PolicyOpen || s.Timeout != 100*time.Millisecond || s.pages != 64 || string(s.config) != "null" {
		t.Errorf("defaults: policy %s, timeout %s, %d pages, config %s", s.FailurePolicy, s.Timeout, s.pages, s.config)
	}
	if s, _ := check(Config{Name: "p", Path: "/p.wasm"}); s.pages != 1024 {
		t.Errorf("the default memory limit is %d pages, want 1024 (64 MiB)", s.pages)
	}
}

// TestLoadWarmCache measures loading a plugin whose compiled code is in the
// on-disk cache: the design allows 300 ms (more under the race detector).
func TestLoadWarmCache(t *testing.T) {
	cfg := Config{Name: "reweight", Path: guest("reweight"), FailurePolicy: PolicyClosed}
	newChain(t, Options{}, cfg) // fills the cache on a first run
	start := time.Now()
	newChain(t, Options{}, cfg)
	elapsed := time.Since(start)
	limit := 300 * time.Millisecond
	if raceEnabled {
		limit *= 5
	}
	t.Logf("loaded a %d-byte guest from the warm cache in %s", fileSize(t, cfg.Path), elapsed)
	if elapsed > limit {
		t.Errorf("loading from the warm cache took %s, more than %s", elapsed, limit)
	}
}

func fileSize(t testing.TB, path string) int64 {
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Size()
}

// TestLoadCacheUnusable shows that an unusable cache directory only costs
// a warning: plugins are then compiled in memory.
func TestLoadCacheUnusable(t *testing.T) {
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	log, logs := testLog(t)
	cache := newCompilationCache(file, log)
	defer cache.Close(context.Background())
	if len(logs.lines("Plugin compilation cache unavailable", "dir="+file)) != 1 {
		t.Errorf("no warning about the cache directory")
	}
	if cache == nil {
		t.Errorf("no in-memory cache")
	}
}
