package files

import (
	"cmp"
	"log/slog"
	"maps"
	"slices"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

// Objects is what a folder of manifests defines, as whole decoded objects
// (defaults applied), for weir diagnose, which reads fields the source's
// records leave out: a Service's selector and target ports.
type Objects struct {
	// Services by namespace/name.
	Services map[string]*corev1.Service
	// Slices by the namespace/name of the Service they belong to (their
	// kubernetes.io/service-name label), sorted by name.
	Slices map[string][]*discoveryv1.EndpointSlice
	// Nodes by name.
	Nodes map[string]*corev1.Node
}

// ReadObjects reads every manifest under dir once, as the source would,
// without watching anything. Where several files define one object the
// last file by path wins, as in the source. Documents that cannot be used
// are logged to log and left out.
func ReadObjects(dir string, log *slog.Logger) (*Objects, error) {
	if err := checkDir(dir); err != nil {
		return nil, err
	}
	t := &tree{root: dir, log: log, dirs: map[string]bool{}, warned: map[string]bool{}}
	found := map[key]object{}
	for _, path := range slices.Sorted(maps.Keys(t.walk(dir))) {
		l := readFile(log.Handler(), nil, path)
		l.logs.replay()
		if l.err != nil {
			log.Warn("Cannot read manifest file; skipping it", "path", path, "error", l.err)
		}
		maps.Copy(found, l.objs)
	}
	out := &Objects{Services: map[string]*corev1.Service{}, Slices: map[string][]*discoveryv1.EndpointSlice{}, Nodes: map[string]*corev1.Node{}}
	for k, obj := range found {
		switch o := obj.(type) {
		case *corev1.Service:
			out.Services[k.namespace+"/"+k.name] = o
		case *discoveryv1.EndpointSlice:
			svc := o.Namespace + "/" + o.Labels[discoveryv1.LabelServiceName]
			out.Slices[svc] = append(out.Slices[svc], o)
		case *corev1.Node:
			out.Nodes[k.name] = o
		}
	}
	for _, list := range out.Slices {
		slices.SortFunc(list, func(a, b *discoveryv1.EndpointSlice) int { return cmp.Compare(a.Name, b.Name) })
	}
	return out, nil
}
