package planner_test

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"sigs.k8s.io/yaml"

	"github.com/weirproxy/weir/core/planner"
	"github.com/weirproxy/weir/core/source"
	"github.com/weirproxy/weir/core/tracker"
	"github.com/weirproxy/weir/internal/golden"
)

// TestGolden plans every testdata/<case>.yaml as node-a and compares the
// rendered plan services and problems with testdata/<case>.plan.
func TestGolden(t *testing.T) {
	cases, err := filepath.Glob(filepath.Join("testdata", "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if len(cases) == 0 {
		t.Fatal("no testdata/*.yaml cases")
	}
	for _, in := range cases {
		name := strings.TrimSuffix(filepath.Base(in), ".yaml")
		t.Run(name, func(t *testing.T) {
			states := readStates(t, in)
			got := render(states)
			// The planner is pure: planning the same input again gives the same text.
			if again := render(states); again != got {
				t.Fatalf("second run differs from the first:\n%s\nvs\n%s", got, again)
			}
			// A handler that takes objects gets them made from the records:
			// they plan the same.
			if again := render(viaObjects(states)); again != got {
				t.Fatalf("the objects made from the records plan differently:\n%s\nvs\n%s", again, got)
			}
			golden.Compare(t, strings.TrimSuffix(in, ".yaml")+".plan", got)
		})
	}
}

// viaObjects returns the records of the objects made from the records of
// states.
func viaObjects(states map[string]tracker.ServiceState) map[string]tracker.ServiceState {
	c := source.NewCompactor()
	out := map[string]tracker.ServiceState{}
	for name, st := range states {
		r := tracker.ServiceState{Service: c.Service(st.Service.Object())}
		for _, s := range st.Slices {
			r.Slices = append(r.Slices, c.EndpointSlice(s.Object()))
		}
		out[name] = r
	}
	return out
}

// goldenConfig plans as node-a in zone-a with the API server's default
// node port range.
var goldenConfig = planner.Config{NodeName: "node-a", Zone: "zone-a", NodePorts: planner.PortRange{First: 30000, Last: 32767}}

// render plans each service in name order as node-a and renders the result.
func render(states map[string]tracker.ServiceState) string {
	var b strings.Builder
	for _, name := range sortedKeys(states) {
		fmt.Fprintf(&b, "# %s\n", name)
		services, problems := planner.Service(goldenConfig, states[name])
		for _, s := range services {
			b.WriteString(s.String())
		}
		for _, p := range problems {
			fmt.Fprintf(&b, "problem: %s\n", p)
		}
	}
	return b.String()
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

var separator = regexp.MustCompile(`(?m)^---[ \t]*$`)

// readStates decodes a multi-document manifest file into records, as the
// sources make them, and groups its EndpointSlices under their services by
// the kubernetes.io/service-name label, slices sorted by name as the
// tracker returns them.
func readStates(t *testing.T, path string) map[string]tracker.ServiceState {
	t.Helper()
	c := source.NewCompactor()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	states := map[string]tracker.ServiceState{}
	for i, doc := range separator.Split(string(data), -1) {
		if isBlank(doc) {
			continue
		}
		var head struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
		}
		if err := yaml.Unmarshal([]byte(doc), &head); err != nil {
			t.Fatalf("%s: document %d: %v", path, i, err)
		}
		switch head.Kind {
		case "Service":
			svc := &corev1.Service{}
			if err := yaml.UnmarshalStrict([]byte(doc), svc); err != nil {
				t.Fatalf("%s: document %d: %v", path, i, err)
			}
			key := svc.Namespace + "/" + svc.Name
			st := states[key]
			if st.Service != nil {
				t.Fatalf("%s: Service %s defined twice", path, key)
			}
			st.Service = c.Service(svc)
			states[key] = st
		case "EndpointSlice":
			s := &discoveryv1.EndpointSlice{}
			if err := yaml.UnmarshalStrict([]byte(doc), s); err != nil {
				t.Fatalf("%s: document %d: %v", path, i, err)
			}
			svc := s.Labels[discoveryv1.LabelServiceName]
			if svc == "" {
				t.Fatalf("%s: EndpointSlice %s/%s has no %s label", path, s.Namespace, s.Name, discoveryv1.LabelServiceName)
			}
			key := s.Namespace + "/" + svc
			st := states[key]
			st.Slices = append(st.Slices, c.EndpointSlice(s))
			states[key] = st
		default:
			t.Fatalf("%s: document %d: unexpected kind %q", path, i, head.Kind)
		}
	}
	for key, st := range states {
		slices.SortFunc(st.Slices, func(a, b *source.EndpointSlice) int { return strings.Compare(a.Name, b.Name) })
		states[key] = st
	}
	return states
}

// isBlank reports whether a YAML document holds only comments and space.
func isBlank(doc string) bool {
	for line := range strings.Lines(doc) {
		line = strings.TrimSpace(line)
		if line != "" && !strings.HasPrefix(line, "#") {
			return false
		}
	}
	return true
}

// TestGoldenFilesHaveCases catches a stale golden file whose manifest was
// renamed or removed.
func TestGoldenFilesHaveCases(t *testing.T) {
	goldens, err := filepath.Glob(filepath.Join("testdata", "*.plan"))
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range goldens {
		in := strings.TrimSuffix(g, ".plan") + ".yaml"
		if _, err := os.Stat(in); err != nil {
			t.Errorf("golden file %s has no manifest %s", g, in)
		}
	}
}
