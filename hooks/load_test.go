package hooks

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"maps"
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
	got := newErr(t, Config{Name: "v3", Path: guest("abiv3"), FailurePolicy: PolicyClosed})
	want := `plugin "v3": ` + guest("abiv3") + ": it speaks plugin ABI version 3, this Weir speaks versions 1 to 2"
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
		{"no name", func(c *Config) { c.Name = "" }, `plugins[0].name: "" is not allowed; use ` + Allowed("name")},
		{"bad name", func(c *Config) { c.Name = "P" }, `plugins[0].name: "P" is not allowed; use ` + Allowed("name")},
		{"no path", func(c *Config) { c.Path = "" }, `plugins[0].path: "" is not allowed; use ` + Allowed("path")},
		{"bad sha256", func(c *Config) { c.SHA256 = "abc" }, `plugins[0].sha256: "abc" is not allowed; use ` + Allowed("sha256")},
		{"bad policy", func(c *Config) { c.FailurePolicy = "ajar" },
			`plugins[0].failurePolicy: "ajar" is not allowed; use open or closed`},
		{"negative timeout", func(c *Config) { c.Timeout = -time.Second },
			`plugins[0].timeout: "-1s" is not allowed; use a duration between 1ms and 10s, such as 100ms`},
		{"long timeout", func(c *Config) { c.Timeout = time.Minute }, `plugins[0].timeout: "1m0s" is not allowed; use ` + Allowed("timeout")},
		{"small memory", func(c *Config) { c.MemoryLimit = 1000 },
			`plugins[0].memoryLimit: "1000" is not allowed; use a size between 4Mi and 4Gi, such as 64Mi`},
		{"bad namespace", func(c *Config) { c.Match.Namespaces = []string{"a", "B"} },
			`plugins[0].match.namespaces: "a,B" is not allowed; use ` + Allowed("match.namespaces")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := ok
			tc.edit(&c)
			if got := newErr(t, c); got != tc.want {
				t.Errorf("New returned %q, want %q", got, tc.want)
			}
		})
	}
	if got := newErr(t, ok, ok); got != `plugins[1].name: "p" is not allowed; use a name not used by another plugin (plugins[0] has it)` {
		t.Errorf("New returned %q for a duplicate name", got)
	}
}

func TestLoadDefaults(t *testing.T) {
	s, err := complete(Config{Name: "p", Path: "/p.wasm"})
	if err != nil {
		t.Fatal(err)
	}
	if s.FailurePolicy != PolicyOpen || s.Timeout != 100*time.Millisecond || s.pages != 1024 || string(s.config) != "null" {
		t.Errorf("defaults: policy %s, timeout %s, %d pages (want 1024, 64 MiB), config %s",
			s.FailurePolicy, s.Timeout, s.pages, s.config)
	}
	if s, _ := complete(Config{Name: "p", Path: "/p.wasm", MemoryLimit: 4<<20 + 1000}); s.pages != 64 || s.MemoryLimit != 4<<20 {
		t.Errorf("a memory limit of 4 MiB and 1000 bytes is %d pages, %d bytes; want 64 pages, 4 MiB", s.pages, s.MemoryLimit)
	}
}

// TestLoadWarmCache shows that a second load of a plugin takes its compiled
// code from the on-disk cache: the first fills the cache folder, the
// second leaves it as it was (wazero writes only what it had to compile).
// How long a warm load takes is BenchmarkLoad's to measure.
func TestLoadWarmCache(t *testing.T) {
	dir := t.TempDir()
	cfg := Config{Name: "reweight", Path: guest("reweight"), FailurePolicy: PolicyClosed}
	newChain(t, Options{CacheDir: dir}, cfg)
	filled := cacheFiles(t, dir)
	if len(filled) == 0 {
		t.Fatalf("the first load left the cache folder %s empty", dir)
	}
	newChain(t, Options{CacheDir: dir}, cfg)
	if again := cacheFiles(t, dir); !maps.Equal(again, filled) {
		t.Errorf("the second load changed the cache: %v, was %v; it compiled again", again, filled)
	}
}

// cacheFiles returns the size and modification time of every file under dir.
func cacheFiles(t *testing.T, dir string) map[string]string {
	t.Helper()
	files := map[string]string{}
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		files[path] = fmt.Sprintf("%d bytes, %s", fi.Size(), fi.ModTime().Format(time.RFC3339Nano))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
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
