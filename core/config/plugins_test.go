package config

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/labels"

	"github.com/weirproxy/weir/hooks"
)

func TestPlugins(t *testing.T) {
	yaml := `plugins:
  - name: zone-preference
    path: /var/lib/weir/plugins/zone-preference.wasm
    sha256: 0123456789ABCDEF0123456789abcdef0123456789abcdef0123456789abcdef
    failurePolicy: closed
    timeout: 250ms
    memoryLimit: 32Mi
    config:
      minEndpoints: 3
      zones: [a, b]
    match:
      namespaces: [shop, payments]
      selector: "app in (web, api),tier!=db"
      annotations: [zone-preference.weir.dev/min]
  - name: drain
    path: drain.wasm
`
	got, err := load(t, input{yaml: yaml})
	if err != nil {
		t.Fatal(err)
	}
	sel, err := labels.Parse("app in (web, api),tier!=db")
	if err != nil {
		t.Fatal(err)
	}
	// Left out, failurePolicy, timeout and memoryLimit stay zero: the hooks
	// fill in their defaults.
	want := []hooks.Config{{
		Name: "zone-preference", Path: "/var/lib/weir/plugins/zone-preference.wasm",
		SHA256:        "0123456789ABCDEF0123456789abcdef0123456789abcdef0123456789abcdef",
		FailurePolicy: "closed", Timeout: 250 * time.Millisecond, MemoryLimit: 32 << 20,
		Config: map[string]any{"minEndpoints": 3, "zones": []any{"a", "b"}},
		Match: hooks.Match{Namespaces: []string{"shop", "payments"}, Selector: sel,
			Annotations: []string{"zone-preference.weir.dev/min"}},
	}, {
		Name: "drain", Path: "drain.wasm",
	}}
	if !reflect.DeepEqual(got.Plugins, want) {
		t.Errorf("plugins\n got %#v\nwant %#v", got.Plugins, want)
	}
}

func TestPluginErrors(t *testing.T) {
	tests := []struct {
		entry string
		want  []string // one message fragment per expected error
	}{
		{"{path: a.wasm}", []string{`plugins[0].name: "" (from file`}},
		{"{name: Bad_Name, path: a.wasm}", []string{`plugins[0].name: "Bad_Name"`, "lower-case"}},
		{"{name: a}", []string{`plugins[0].path: ""`, ".wasm file"}},
		{"{name: a, path: a.wasm, sha256: abc}", []string{`plugins[0].sha256: "abc"`, "64 hex digits"}},
		{"{name: a, path: a.wasm, failurePolicy: fail}", []string{`plugins[0].failurePolicy: "fail"`, "open or closed"}},
		{"{name: a, path: a.wasm, timeout: 1h}", []string{`plugins[0].timeout: "1h"`, "between 1ms and 10s"}},
		{"{name: a, path: a.wasm, timeout: soon}", []string{`plugins[0].timeout: "soon"`}},
		{"{name: a, path: a.wasm, memoryLimit: 1Mi}", []string{`plugins[0].memoryLimit: "1Mi"`, "between 4Mi and 4Gi"}},
		{"{name: a, path: a.wasm, match: {selector: 'a in b'}}", []string{`plugins[0].match.selector: "a in b"`}},
		{"{name: a, path: a.wasm, match: {namespaces: [Not/Valid]}}", []string{`plugins[0].match.namespaces`}},
		{"{name: a, path: a.wasm, match: {labels: x}}", []string{`plugins[0].match.labels`, "namespaces, selector, annotations"}},
		{"{name: a, path: a.wasm, match: {annotations: ['a b']}}", []string{`plugins[0].match.annotations: "[a b]"`, "annotation keys"}},
		{"{name: a, path: a.wasm, timout: 1s}", []string{`unknown key "plugins[0].timout"`, `did you mean "plugins[0].timeout"?`}},
		{"{name: a, path: a.wasm}\n  - {name: a, path: b.wasm}", []string{`plugins[1].name: "a"`, "plugins[0] has it"}},
		{"{name: a, path: 'oci://ghcr.io/acme/a'}", []string{`plugins[0].path: "oci://ghcr.io/acme/a"`, "oci://REGISTRY/REPO:TAG"}},
		{"{name: a, path: a.wasm, publicKey: cosign.pub}", []string{`plugins[0].publicKey: "cosign.pub"`, "with an oci:// path only"}},
		{"{name: a, path: a.wasm, dockerConfig: c.json}", []string{`plugins[0].dockerConfig: "c.json"`, "with an oci:// path only"}},
		{"{name: a, path: 'oci://ghcr.io/acme/a:v1', refreshInterval: 100ms}", []string{`plugins[0].refreshInterval: "100ms"`, "between 1s and 24h, such as 5m"}},
		{"{name: a, path: 'oci://ghcr.io/acme/a:v1', refreshInterval: often}", []string{`plugins[0].refreshInterval: "often"`}},
		{"{name: a, path: a.wasm, refreshInterval: 1m}", []string{`plugins[0].refreshInterval: "1m"`, "with an oci:// path only"}},
		{"{name: a, path: a.wasm, signals: [cpu]}", []string{`plugins[0].signals: "[cpu]"`, "the only one is connections"}},
		{"{name: a, path: a.wasm, signals: []}", []string{`plugins[0].signals: "[]"`}},
		{"{name: a, path: a.wasm, interval: 1s}", []string{`plugins[0].interval: "1s"`, "with signals only"}},
		{"{name: a, path: a.wasm, signals: [connections], interval: 10ms}", []string{`plugins[0].interval: "10ms"`, "between 100ms and 1h0m0s"}},
	}
	for _, tc := range tests {
		t.Run(tc.entry, func(t *testing.T) {
			_, err := load(t, input{yaml: "plugins:\n  - " + tc.entry + "\n"})
			var e *Error
			if !errors.As(err, &e) {
				t.Fatalf("err = %v, want a *config.Error", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

// TestPluginOCI reads a plugin from a registry with its keys.
func TestPluginOCI(t *testing.T) {
	yaml := `plugins:
  - name: zone-preference
    path: oci://ghcr.io/acme/zone-preference:v1
    sha256: "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
    publicKey: /etc/weir/cosign.pub
    dockerConfig: /var/run/secrets/weir-registry/.dockerconfigjson
    refreshInterval: 10m
`
	got, err := load(t, input{yaml: yaml})
	if err != nil {
		t.Fatal(err)
	}
	want := []hooks.Config{{
		Name: "zone-preference", Path: "oci://ghcr.io/acme/zone-preference:v1",
		SHA256:    "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
		PublicKey: "/etc/weir/cosign.pub", DockerConfig: "/var/run/secrets/weir-registry/.dockerconfigjson",
		RefreshInterval: 10 * time.Minute,
	}}
	if !reflect.DeepEqual(got.Plugins, want) {
		t.Errorf("plugins\n got %#v\nwant %#v", got.Plugins, want)
	}
}

// TestPluginSignals reads a plugin with live signals.
func TestPluginSignals(t *testing.T) {
	got, err := load(t, input{yaml: "plugins:\n  - {name: lc, path: lc.wasm, signals: [connections], interval: 500ms}\n"})
	if err != nil {
		t.Fatal(err)
	}
	want := []hooks.Config{{Name: "lc", Path: "lc.wasm", Signals: []string{hooks.SignalConnections}, Interval: 500 * time.Millisecond}}
	if !reflect.DeepEqual(got.Plugins, want) {
		t.Errorf("plugins\n got %#v\nwant %#v", got.Plugins, want)
	}
}

// TestPluginSHA256ReadAsNumber shows the error for a pin YAML reads as a
// number (64 zeros unquoted are the number 0, 64 decimal digits a float):
// it says why it shows a value the user never wrote and how to write it.
func TestPluginSHA256ReadAsNumber(t *testing.T) {
	for _, tc := range []struct{ value, read string }{
		{strings.Repeat("0", 64), "0"},
		{"1" + strings.Repeat("0", 62) + "9", "1e+63"},
	} {
		_, err := load(t, input{yaml: "plugins:\n  - {name: a, path: a.wasm, sha256: " + tc.value + "}\n"})
		want := `plugins[0].sha256: "` + tc.read + `" (from file `
		explained := `is not allowed; use the file's SHA-256 as 64 hex digits in quotes (sha256: "..."): ` +
			"YAML read the unquoted value as the number " + tc.read
		if err == nil || !strings.Contains(err.Error(), want) || !strings.HasSuffix(err.Error(), explained) {
			t.Errorf("sha256: %s: err = %v, want %q ... %q", tc.value, err, want, explained)
		}
	}
	if _, err := load(t, input{yaml: "plugins:\n  - {name: a, path: a.wasm, sha256: 12e4" + strings.Repeat("5", 60) + "}\n"}); err != nil {
		t.Errorf("a pin YAML reads as text: %v", err)
	}
}

// TestPluginExamples loads every example plugin's config.yaml, so the
// examples cannot drift from what Weir accepts.
func TestPluginExamples(t *testing.T) {
	files, err := filepath.Glob("../../plugins/*/config.yaml")
	if err != nil || len(files) < 5 {
		t.Fatalf("example configs: %v (found %d)", err, len(files))
	}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		got, err := load(t, input{yaml: string(data)})
		if err != nil {
			t.Errorf("%s: %v", f, err)
			continue
		}
		if name := filepath.Base(filepath.Dir(f)); len(got.Plugins) != 1 || got.Plugins[0].Name != name {
			t.Errorf("%s: plugins %+v, want one named %s", f, got.Plugins, name)
		}
	}
}
