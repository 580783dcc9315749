//go:build e2e

package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/weirproxy/weir/test/e2e/controlplane"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/yaml"
)

// deployDir holds the manifests operators apply.
const deployDir = "../../deploy/kubernetes"

// applyManifests applies every document of deploy/kubernetes to the API
// server with server-side apply; with dryRun the server validates and
// defaults them without storing anything.
func applyManifests(ctx context.Context, t *testing.T, cp *controlplane.ControlPlane, dryRun bool) {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(deployDir, "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	opts := metav1.PatchOptions{FieldManager: "weir-e2e"}
	if dryRun {
		opts.DryRun = []string{metav1.DryRunAll}
	}
	applied := 0
	for _, f := range files {
		if filepath.Base(f) == "kustomization.yaml" {
			continue
		}
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, doc := range strings.Split(string(raw), "\n---\n") {
			var meta struct {
				Kind     string `json:"kind"`
				Metadata struct {
					Name, Namespace string
				} `json:"metadata"`
			}
			if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			data, err := yaml.YAMLToJSON([]byte(doc))
			if err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			name, ns, c := meta.Metadata.Name, meta.Metadata.Namespace, cp.Client
			switch meta.Kind {
			case "ServiceAccount":
				_, err = c.CoreV1().ServiceAccounts(ns).Patch(ctx, name, types.ApplyPatchType, data, opts)
			case "ConfigMap":
				_, err = c.CoreV1().ConfigMaps(ns).Patch(ctx, name, types.ApplyPatchType, data, opts)
			case "ClusterRole":
				_, err = c.RbacV1().ClusterRoles().Patch(ctx, name, types.ApplyPatchType, data, opts)
			case "ClusterRoleBinding":
				_, err = c.RbacV1().ClusterRoleBindings().Patch(ctx, name, types.ApplyPatchType, data, opts)
			case "DaemonSet":
				_, err = c.AppsV1().DaemonSets(ns).Patch(ctx, name, types.ApplyPatchType, data, opts)
			default:
				t.Fatalf("%s: kind %q: teach applyManifests about it", f, meta.Kind)
			}
			if err != nil {
				t.Fatalf("apply %s %s/%s from %s (dry run %v): %v", meta.Kind, ns, name, filepath.Base(f), dryRun, err)
			}
			applied++
		}
	}
	if applied < 5 {
		t.Fatalf("applied %d objects from %s, want at least 5", applied, deployDir)
	}
}

// TestDeployManifestsAreValid applies deploy/kubernetes to a real API
// server, first as a server-side dry run (validation and defaulting of
// every object, the DaemonSet included), then for real.
func TestDeployManifestsAreValid(t *testing.T) {
	cp := controlplane.Start(t)
	ctx := t.Context()
	applyManifests(ctx, t, cp, true)
	applyManifests(ctx, t, cp, false)
	ds, err := cp.Client.AppsV1().DaemonSets("kube-system").Get(ctx, "weir", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !ds.Spec.Template.Spec.HostNetwork {
		t.Errorf("the stored DaemonSet lost hostNetwork")
	}
}
