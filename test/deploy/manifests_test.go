// Package deploy checks the manifests and reference configuration in
// deploy/: that they decode strictly into their Kubernetes types, that the
// configuration they carry loads, and that the DaemonSet keeps the
// properties operators rely on. (The e2e suite applies them to a real API
// server.)
package deploy

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"sigs.k8s.io/yaml"

	"github.com/weirproxy/weir/core/config"
)

const dir = "../../deploy"

// documents returns the YAML documents of a manifest file.
func documents(t *testing.T, name string) [][]byte {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(dir, "kubernetes", name))
	if err != nil {
		t.Fatal(err)
	}
	var docs [][]byte
	for _, d := range strings.Split(string(raw), "\n---\n") {
		docs = append(docs, []byte(d))
	}
	return docs
}

// decode strictly decodes doc into obj: an unknown or misspelt field fails.
func decode(t *testing.T, what string, doc []byte, obj any) {
	t.Helper()
	if err := yaml.UnmarshalStrict(doc, obj); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// loadConfig loads the file at path with the environment the DaemonSet
// gives Weir (a field reference reads "node-a"), its WEIR_CONFIG pointed
// at path.
func loadConfig(t *testing.T, path string) *config.Config {
	t.Helper()
	var ds appsv1.DaemonSet
	decode(t, "daemonset.yaml", documents(t, "daemonset.yaml")[0], &ds)
	environ := []string{"WEIR_CONFIG=" + path}
	for _, e := range ds.Spec.Template.Spec.Containers[0].Env {
		v := e.Value
		switch {
		case e.Name == "WEIR_CONFIG":
			continue // path, set above
		case e.ValueFrom == nil:
		case e.ValueFrom.FieldRef != nil:
			v = "node-a"
		default:
			continue // the Go runtime's settings, not Weir's
		}
		environ = append(environ, e.Name+"="+v)
	}
	c, err := config.Load(nil, environ)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return c
}

func TestReferenceConfigLoads(t *testing.T) {
	c := loadConfig(t, filepath.Join(dir, "weir.yaml"))
	if c.Source.Kind != "kubernetes" || c.HealthzBindAddress != "0.0.0.0:10256" {
		t.Errorf("deploy/weir.yaml: source.kind %q, healthzBindAddress %q", c.Source.Kind, c.HealthzBindAddress)
	}
	checkNodePorts(t, "deploy/weir.yaml", c)
}

// checkNodePorts checks that a shipped configuration in mode nftables
// serves node ports where kube-proxy's nftables mode does: on the Node's
// primary IPs, never on 127.0.0.1, with no setting that has no effect.
func checkNodePorts(t *testing.T, what string, c *config.Config) {
	t.Helper()
	if c.Mode == "nftables" && (c.NodePortAddresses.String() != "primary" || c.LocalhostNodePorts || len(c.Ineffective) > 0) {
		t.Errorf("%s: nodePortAddresses %s, localhostNodePorts %v, ineffective %q; want primary, false, none in mode nftables",
			what, c.NodePortAddresses, c.LocalhostNodePorts, c.Ineffective)
	}
}

func TestConfigMapCarriesAValidConfig(t *testing.T) {
	var cm corev1.ConfigMap
	decode(t, "configmap.yaml", documents(t, "configmap.yaml")[0], &cm)
	path := filepath.Join(t.TempDir(), "weir.yaml")
	if err := os.WriteFile(path, []byte(cm.Data["weir.yaml"]), 0o644); err != nil {
		t.Fatal(err)
	}
	c := loadConfig(t, path)
	if c.Source.Kind != "kubernetes" {
		t.Errorf("the ConfigMap's config reads source.kind %q, want kubernetes", c.Source.Kind)
	}
	checkNodePorts(t, "the ConfigMap's config", c)
}

func TestRBACGrantsOnlyWhatWeirUses(t *testing.T) {
	docs := documents(t, "rbac.yaml")
	var role rbacv1.ClusterRole
	var binding rbacv1.ClusterRoleBinding
	decode(t, "ClusterRole", docs[0], &role)
	decode(t, "ClusterRoleBinding", docs[1], &binding)
	var grants []string
	for _, r := range role.Rules {
		for _, res := range r.Resources {
			grants = append(grants, res+":"+strings.Join(r.Verbs, ","))
		}
	}
	slices.Sort(grants)
	want := []string{"endpointslices:get,list,watch", "events:create,patch,update", "nodes:get,list,watch", "servicecidrs:get,list,watch", "services:get,list,watch"}
	if !slices.Equal(grants, want) {
		t.Errorf("ClusterRole grants %q, want %q", grants, want)
	}
	var sa corev1.ServiceAccount
	decode(t, "ServiceAccount", documents(t, "serviceaccount.yaml")[0], &sa)
	if s := binding.Subjects; len(s) != 1 || s[0].Name != sa.Name || s[0].Namespace != sa.Namespace || binding.RoleRef.Name != role.Name {
		t.Errorf("the binding does not bind ClusterRole %s to ServiceAccount %s/%s: %+v", role.Name, sa.Namespace, sa.Name, binding)
	}
}

func TestDaemonSet(t *testing.T) {
	var ds appsv1.DaemonSet
	decode(t, "daemonset.yaml", documents(t, "daemonset.yaml")[0], &ds)
	spec := ds.Spec.Template.Spec
	if !spec.HostNetwork || spec.PriorityClassName != "system-node-critical" {
		t.Errorf("hostNetwork %v, priorityClassName %q", spec.HostNetwork, spec.PriorityClassName)
	}
	if len(spec.Tolerations) != 1 || spec.Tolerations[0].Operator != corev1.TolerationOpExists || spec.Tolerations[0].Key != "" {
		t.Errorf("tolerations %+v, want one that tolerates everything", spec.Tolerations)
	}
	if ds.Spec.UpdateStrategy.Type != appsv1.RollingUpdateDaemonSetStrategyType {
		t.Errorf("update strategy %q", ds.Spec.UpdateStrategy.Type)
	}
	c := spec.Containers[0]
	sc := c.SecurityContext
	if sc == nil || sc.Privileged == nil || *sc.Privileged || sc.Capabilities == nil {
		t.Fatalf("container %s: want an unprivileged security context with capabilities, got %+v", c.Name, sc)
	}
	if got := sc.Capabilities.Add; !slices.Equal(got, []corev1.Capability{"NET_ADMIN", "NET_RAW", "SYS_MODULE"}) {
		t.Errorf("capabilities %v", got)
	}
	env := map[string]corev1.EnvVar{}
	for _, e := range c.Env {
		env[e.Name] = e
	}
	if e := env["WEIR_NODE_NAME"]; e.ValueFrom == nil || e.ValueFrom.FieldRef == nil || e.ValueFrom.FieldRef.FieldPath != "spec.nodeName" {
		t.Errorf("WEIR_NODE_NAME must come from spec.nodeName: %+v", e)
	}
	mounts := map[string]string{}
	for _, m := range c.VolumeMounts {
		mounts[m.Name] = m.MountPath
	}
	if env["WEIR_PROC_SYS"].Value+"/net" != mounts["proc-sys-net"] {
		t.Errorf("WEIR_PROC_SYS %q does not match the /proc/sys/net mount at %q", env["WEIR_PROC_SYS"].Value, mounts["proc-sys-net"])
	}
	for name := range mounts {
		if !slices.ContainsFunc(spec.Volumes, func(v corev1.Volume) bool { return v.Name == name }) {
			t.Errorf("volume mount %s has no volume", name)
		}
	}
	// WEIR_CONFIG rather than --config: kubectl exec's commands (weir
	// diagnose, verify) inherit it.
	if mounts["config"] != "/etc/weir" || env["WEIR_CONFIG"].Value != "/etc/weir/weir.yaml" || !slices.Equal(c.Args, []string{"run"}) {
		t.Errorf("the config is mounted at %q; WEIR_CONFIG %q, args %q; want /etc/weir/weir.yaml from WEIR_CONFIG and args [run]",
			mounts["config"], env["WEIR_CONFIG"].Value, c.Args)
	}
	if c.LivenessProbe == nil || c.LivenessProbe.HTTPGet.Path != "/livez" {
		t.Errorf("liveness probe %+v, want /livez", c.LivenessProbe)
	}
}

// TestDaemonSetMemoryLimit checks that the container has a memory limit
// and that the Go runtime's soft limit, GOMEMLIMIT, is that limit in bytes
// (the downward API's limits.memory of the same container, which
// GOMEMLIMIT reads as bytes), so the garbage collector keeps the heap
// under it rather than at twice what is live.
func TestDaemonSetMemoryLimit(t *testing.T) {
	var ds appsv1.DaemonSet
	decode(t, "daemonset.yaml", documents(t, "daemonset.yaml")[0], &ds)
	c := ds.Spec.Template.Spec.Containers[0]
	limit, ok := c.Resources.Limits[corev1.ResourceMemory]
	if !ok {
		t.Fatalf("container %s has no memory limit", c.Name)
	}
	if request := c.Resources.Requests[corev1.ResourceMemory]; request.Cmp(limit) > 0 {
		t.Errorf("memory request %s is over the limit %s", request.String(), limit.String())
	}
	// Issue 17: 10k services × 10 endpoints peak near 300 MiB in the first
	// sync (docs/operations.md); the default must hold them.
	if limit.Value() < 384<<20 {
		t.Errorf("memory limit %s holds less than 10k services", limit.String())
	}
	var found bool
	for _, e := range c.Env {
		if e.Name != "GOMEMLIMIT" {
			continue
		}
		found = true
		if e.Value != "" || e.ValueFrom == nil || e.ValueFrom.ResourceFieldRef == nil {
			t.Fatalf("GOMEMLIMIT must come from the downward API: %+v", e)
		}
		ref := e.ValueFrom.ResourceFieldRef
		if ref.Resource != "limits.memory" || (ref.ContainerName != "" && ref.ContainerName != c.Name) {
			t.Errorf("GOMEMLIMIT comes from %s of container %q, want limits.memory of %s", ref.Resource, ref.ContainerName, c.Name)
		}
		// GOMEMLIMIT takes a plain number as bytes: the divisor must be 1.
		if d := ref.Divisor; !d.IsZero() && d.Value() != 1 {
			t.Errorf("GOMEMLIMIT's divisor is %s: the runtime would read the number as bytes", d.String())
		}
	}
	if !found {
		t.Errorf("container %s does not set GOMEMLIMIT", c.Name)
	}
}
