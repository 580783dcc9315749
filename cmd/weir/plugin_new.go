package main

import (
	"bytes"
	"embed"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"text/template"

	"github.com/spf13/pflag"

	"github.com/weirproxy/weir/sdk/abi"
	"github.com/weirproxy/weir/sdk/plan"
	"github.com/weirproxy/weir/sdk/sdktest"
)

// skeletons holds one folder of templates per language: each *.tmpl file
// becomes the file of the same path without .tmpl.
//
//go:embed pluginskel
var skeletons embed.FS

// language is a language weir plugin new knows of.
type language struct {
	// dir is the language's folder in skeletons.
	dir string
	// next says how to build and test the generated plugin.
	next string
	// sdkNote, printed without --sdk-dir, says how to reach the SDK.
	sdkNote string
	// generated returns files made by code rather than templates, by path.
	generated func(s *skeleton) map[string][]byte
}

// languages are the values of --lang. Adding one is a folder of templates
// under pluginskel and an entry here.
var languages = map[string]language{
	"go": {dir: "pluginskel/go", next: "cd %s && go test ./... && " +
		"GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o %s.wasm .",
		sdkNote: "go.mod requires github.com/weirproxy/weir/sdk v0.1.0 (sdk/README.md); to build against " +
			"a checkout of Weir instead, run go mod edit -replace github.com/weirproxy/weir/sdk=/path/to/weir/sdk " +
			"there (or use --sdk-dir)."},
	"rust": {dir: "pluginskel/rust", next: "cd %s && make test build  # %s.wasm",
		sdkNote: "The Makefile and Cargo.toml look for Weir's Rust SDK in ../weir/sdk/rust; set WEIR_SDK " +
			"(and the path in Cargo.toml) to your checkout's sdk/rust, or use --sdk-dir.",
		generated: func(s *skeleton) map[string][]byte {
			return map[string][]byte{"testdata/batch.bin": sampleBatch(s.Name)}
		}},
	"assemblyscript": {dir: "pluginskel/assemblyscript", next: "cd %s && npm install && npm test  # %s.wasm, then weir plugin test",
		sdkNote: "assembly/index.ts imports Weir's AssemblyScript SDK from ../weir/sdk/assemblyscript; " +
			"change the paths there and in package.json to your checkout's, or use --sdk-dir."},
}

// sampleBatch is the batch the generated Rust plugin's test reads, as Weir
// would send it: web asks to drain web-1 of web-1 and web-2, solo asks to
// drain its only endpoint, and plain asks nothing; the annotation is the
// plugin's, NAME.weir.dev/drain.
func sampleBatch(name string) []byte {
	ep := func(addr, pod string) plan.Endpoint { return sdktest.Endpoint(addr, 8080, "node-a", "zone-a", pod) }
	web := sdktest.Service("shop", "web", "10.96.0.10", 80, ep("10.244.1.5", "web-1"), ep("10.244.1.6", "web-2"))
	solo := sdktest.Service("shop", "solo", "10.96.0.11", 80, ep("10.244.1.7", "solo-1"))
	plain := sdktest.Service("shop", "plain", "10.96.0.12", 80, ep("10.244.1.8", "plain-1"), ep("10.244.1.9", "plain-2"))
	web.Annotations = map[string]string{name + ".weir.dev/drain": "web-1"}
	solo.Annotations = map[string]string{name + ".weir.dev/drain": "solo-1"}
	var e abi.Encoder
	return slices.Clone(e.Encode(plan.Node{Name: "node-a", Zone: "zone-a"}, []*plan.Service{web, solo, plain}, true))
}

// skeleton is what weir plugin new was asked to write.
type skeleton struct {
	lang, dir string
	// Name is the plugin's name; Module its Go module path; SDKDir, when
	// set, the folder of Weir's sdk module for a replace directive; SDKRel
	// the path of Weir's sdk folder from the skeleton's, for relative
	// imports (../weir/sdk without --sdk-dir).
	Name, Module, SDKDir, SDKRel string
	force                        bool
}

// runPluginNew runs "weir plugin new --lang LANG NAME [DIR]": it writes a
// plugin skeleton that builds and whose tests pass.
func runPluginNew(args []string, stdout, stderr io.Writer) error {
	var s skeleton
	fs := pflag.NewFlagSet("weir plugin new", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&s.lang, "lang", "", "the plugin's language: "+strings.Join(languageNames(), ", ")+" (required)")
	fs.StringVar(&s.Module, "module", "", "the Go module path (default example.com/NAME)")
	fs.StringVar(&s.SDKDir, "sdk-dir", "", "a folder holding Weir's sdk module: go.mod then builds against it (replace directive)")
	fs.BoolVar(&s.force, "force", false, "overwrite files that exist")
	if err := fs.Parse(args); err != nil {
		return fmt.Errorf("%w: %w", errUsage, err)
	}
	if err := s.complete(fs.Args()); err != nil {
		return err
	}
	lang := languages[s.lang]
	if err := s.write(lang.dir); err != nil {
		return err
	}
	if _, err := fmt.Fprintf(stdout, "wrote the %s plugin %s in %s; next:\n  "+lang.next+"\n", s.lang, s.Name, s.dir, s.dir, s.Name); err != nil {
		return err
	}
	if lang.sdkNote != "" && s.SDKDir == "" {
		_, err := fmt.Fprintln(stdout, lang.sdkNote)
		return err
	}
	return nil
}

// languageNames lists the --lang values, sorted.
func languageNames() []string {
	var out []string
	for n := range languages {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

// complete checks the language and the arguments and fills in the defaults.
func (s *skeleton) complete(args []string) error {
	_, ok := languages[s.lang]
	switch {
	case s.lang == "":
		return fmt.Errorf("%w: weir plugin new needs --lang (%s)", errUsage, strings.Join(languageNames(), ", "))
	case !ok:
		return fmt.Errorf("%w: --lang %q: unknown; use %s", errUsage, s.lang, strings.Join(languageNames(), ", "))
	case len(args) < 1 || len(args) > 2:
		return fmt.Errorf("%w: use weir plugin new --lang %s NAME [DIR]", errUsage, s.lang)
	}
	s.Name, s.dir = args[0], args[0]
	if len(args) == 2 {
		s.dir = args[1]
	}
	if !dnsName(s.Name) {
		return fmt.Errorf("%w: plugin name %q: use lower-case letters, digits and '-', at most 63 characters", errUsage, s.Name)
	}
	if s.Module == "" {
		s.Module = "example.com/" + s.Name
	}
	s.SDKRel = "../weir/sdk"
	if s.SDKDir != "" {
		abs, err := filepath.Abs(s.SDKDir)
		if err != nil {
			return err
		}
		s.SDKDir = abs
		dir, err := filepath.Abs(s.dir)
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, abs)
		if err != nil {
			return err
		}
		s.SDKRel = filepath.ToSlash(rel)
	}
	return nil
}

// write renders every template of the language's folder into s.dir. It
// refuses, before writing anything, when a file exists and force is not set.
func (s *skeleton) write(dir string) error {
	files, err := s.render(dir)
	if err != nil {
		return err
	}
	if gen := languages[s.lang].generated; gen != nil {
		for name, data := range gen(s) {
			files.names = append(files.names, name)
			files.data[name] = data
		}
	}
	if !s.force {
		for _, name := range files.names {
			if _, err := os.Stat(filepath.Join(s.dir, name)); err == nil {
				return fmt.Errorf("%s exists; use --force to overwrite it", filepath.Join(s.dir, name))
			}
		}
	}
	for _, name := range files.names {
		p := filepath.Join(s.dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(p, files.data[name], 0o644); err != nil {
			return err
		}
	}
	return nil
}

// rendered is a skeleton's files by path, in order.
type rendered struct {
	names []string
	data  map[string][]byte
}

// render executes the templates under dir with s.
func (s *skeleton) render(dir string) (*rendered, error) {
	out := &rendered{data: map[string][]byte{}}
	err := fs.WalkDir(skeletons, dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		if !strings.HasSuffix(p, ".tmpl") {
			return errors.New("skeleton file without .tmpl: " + p)
		}
		text, err := skeletons.ReadFile(p)
		if err != nil {
			return err
		}
		t, err := template.New(path.Base(p)).Option("missingkey=error").Parse(string(text))
		if err != nil {
			return err
		}
		var b bytes.Buffer
		if err := t.Execute(&b, s); err != nil {
			return err
		}
		name := strings.TrimSuffix(strings.TrimPrefix(p, dir+"/"), ".tmpl")
		out.names = append(out.names, name)
		out.data[name] = b.Bytes()
		return nil
	})
	return out, err
}
