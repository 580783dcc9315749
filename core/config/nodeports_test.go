package config

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// nodePorts is where a loaded configuration serves node ports.
type nodePorts struct {
	addresses string // NodePortAddresses.String()
	localhost bool
}

func nodePortsOf(c *Config) nodePorts {
	return nodePorts{c.NodePortAddresses.String(), c.LocalhostNodePorts}
}

// TestNodePortModeDefaults: nodePortAddresses and localhostNodePorts
// follow the mode the layers chose, whichever layer chose it, as
// kube-proxy's do (primary and no loopback in mode nftables, every local
// address and 127.0.0.1 in mode iptables); a value set in any layer wins
// over the mode's default, whichever layer sets the mode.
func TestNodePortModeDefaults(t *testing.T) {
	nft := nodePorts{"primary", false}
	ipt := nodePorts{"all", true}
	tests := []struct {
		name string
		in   input
		want nodePorts
	}{
		{"nothing set: mode nftables", input{}, nft},
		{"mode nftables in the file", input{yaml: "mode: nftables\n"}, nft},
		{"mode iptables in the file", input{yaml: "mode: iptables\n"}, ipt},
		{"mode ipvs in the file", input{yaml: "mode: ipvs\n"}, ipt},
		{"mode iptables from the environment", input{env: []string{"WEIR_MODE=iptables"}}, ipt},
		{"mode iptables from a flag", input{args: []string{"--mode=iptables"}}, ipt},
		{"flag's nftables over the file's iptables", input{yaml: "mode: iptables\n", args: []string{"--mode=nftables"}}, nft},
		{"environment's iptables over the file's nftables", input{yaml: "mode: nftables\n", env: []string{"WEIR_MODE=iptables"}}, ipt},

		{"all in mode nftables", input{yaml: "nodePortAddresses: [all]\n"}, nodePorts{"all", false}},
		{"all and localhost node ports in mode nftables", input{yaml: "nodePortAddresses: [all]\nlocalhostNodePorts: true\n"}, ipt},
		{"primary in mode iptables", input{yaml: "mode: iptables\nnodePortAddresses: [primary]\n"}, nodePorts{"primary", true}},
		{"no localhost node ports in mode iptables", input{yaml: "mode: iptables\n", env: []string{"WEIR_LOCALHOST_NODE_PORTS=false"}}, nodePorts{"all", false}},
		{"no localhost node ports in mode ipvs", input{args: []string{"--mode=ipvs", "--localhost-node-ports=false"}}, nodePorts{"all", false}},
		{"CIDRs in mode nftables", input{args: []string{"--node-port-addresses=10.0.0.0/8"}}, nodePorts{"10.0.0.0/8", false}},
		{"the file's all survives the flag's mode nftables", input{yaml: "mode: iptables\nnodePortAddresses: [all]\n", args: []string{"--mode=nftables"}}, nodePorts{"all", false}},
		{"the file's false survives the flag's mode iptables", input{yaml: "localhostNodePorts: false\n", args: []string{"--mode=iptables"}}, nodePorts{"all", false}},
		{"the environment's primary survives the file's mode iptables", input{yaml: "mode: iptables\n", env: []string{"WEIR_NODE_PORT_ADDRESSES=primary"}}, nodePorts{"primary", true}},

		{"an empty list is unset in mode nftables", input{yaml: "nodePortAddresses: []\n"}, nft},
		{"an empty list is unset in mode iptables", input{yaml: "mode: iptables\nnodePortAddresses: []\n"}, ipt},
		{"a null value is unset", input{yaml: "mode: iptables\nnodePortAddresses:\nlocalhostNodePorts:\n"}, ipt},
		{"the environment empties the file's CIDRs", input{yaml: "nodePortAddresses: [10.0.0.0/8]\n", env: []string{"WEIR_NODE_PORT_ADDRESSES="}}, nft},
		{"all from the environment", input{env: []string{"WEIR_NODE_PORT_ADDRESSES=all"}}, nodePorts{"all", false}},
		{"all from a flag in mode iptables", input{args: []string{"--mode=iptables", "--node-port-addresses=all"}}, ipt},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, err := load(t, tc.in)
			if err != nil {
				t.Fatal(err)
			}
			if got := nodePortsOf(c); got != tc.want {
				t.Errorf("node ports %+v, want %+v", got, tc.want)
			}
			if len(c.Ineffective) != 0 {
				t.Errorf("ineffective settings %q, want none", c.Ineffective)
			}
		})
	}
}

// TestLocalhostNodePortsNeedAll: localhostNodePorts true in mode
// nftables with nodePortAddresses unset serves no loopback (the default
// there is primary), and Load says so; with an explicit nodePortAddresses
// it does not.
func TestLocalhostNodePortsNeedAll(t *testing.T) {
	c, err := load(t, input{yaml: "localhostNodePorts: true\n"})
	if err != nil {
		t.Fatal(err)
	}
	if got := nodePortsOf(c); got != (nodePorts{"primary", true}) {
		t.Errorf("node ports %+v, want primary with localhostNodePorts as set", got)
	}
	if len(c.Ineffective) != 1 || !strings.HasPrefix(c.Ineffective[0], "localhostNodePorts:") ||
		!strings.Contains(c.Ineffective[0], "nodePortAddresses to [all]") {
		t.Errorf("ineffective settings %q, want one saying localhostNodePorts needs nodePortAddresses [all]", c.Ineffective)
	}
	for _, in := range []input{
		{yaml: "localhostNodePorts: true\nnodePortAddresses: [primary]\n"},
		{yaml: "mode: iptables\nlocalhostNodePorts: true\n"},
	} {
		c, err := load(t, in)
		if err != nil || len(c.Ineffective) != 0 {
			t.Errorf("%q: %v, ineffective %q; want no complaint", in.yaml, err, c.Ineffective)
		}
	}
}

// TestNodePortKeywords: primary and all each stand alone; localhost is
// refused by name, with what to use instead.
func TestNodePortKeywords(t *testing.T) {
	for _, tc := range []struct {
		in      input
		value   string
		allowed string
	}{
		{input{yaml: "nodePortAddresses: [localhost]\n"}, "[localhost]", "localhost is not supported"},
		{input{args: []string{"--node-port-addresses=all,localhost"}}, "all,localhost", "localhostNodePorts true"},
		{input{yaml: "nodePortAddresses: [all, 10.0.0.0/8]\n"}, "[all, 10.0.0.0/8]", "single word primary or all on its own"},
		{input{env: []string{"WEIR_NODE_PORT_ADDRESSES=primary,all"}}, "primary,all", "single word primary or all"},
		{input{yaml: "nodePortAddresses: [All]\n"}, "All", "single word primary or all"},
	} {
		_, err := load(t, tc.in)
		var e *Error
		if !errors.As(err, &e) || e.Key != "nodePortAddresses" || e.Value != tc.value || !strings.Contains(e.Allowed, tc.allowed) {
			t.Errorf("%+v: got %v, want an error on nodePortAddresses %q allowing %q", tc.in, err, tc.value, tc.allowed)
		}
	}
	for raw, want := range map[string]NodePortAddresses{
		"all":     {},
		"primary": {Primary: true},
	} {
		c := &Config{}
		if b := setNodePortAddresses(c, raw); b != nil || c.NodePortAddresses.String() != raw || want.String() != raw {
			t.Errorf("%s: %+v, %v", raw, c.NodePortAddresses, b)
		}
		if got := getNodePortAddresses(c); show(got) != raw {
			t.Errorf("%s renders as %v", raw, got)
		}
	}
}

// TestKubeProxyNodePorts: a KubeProxyConfiguration converts to where
// kube-proxy serves node ports in its mode, written out explicitly;
// iptables.localhostNodePorts counts in iptables mode only, and the
// keywords convert as themselves.
func TestKubeProxyNodePorts(t *testing.T) {
	const head = "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n"
	tests := []struct {
		name, yaml string
		want       nodePorts
		written    []string // in the converted YAML
		warning    string
	}{
		{"nftables", "mode: nftables\n", nodePorts{"primary", false},
			[]string{"nodePortAddresses:\n    - primary", "localhostNodePorts: false"}, ""},
		{"iptables by default", "", nodePorts{"all", true},
			[]string{"nodePortAddresses:\n    - all", "localhostNodePorts: true"}, ""},
		{"iptables without localhost", "iptables: {localhostNodePorts: false}\n", nodePorts{"all", false},
			[]string{"localhostNodePorts: false"}, ""},
		{"ipvs", "mode: ipvs\niptables: {localhostNodePorts: false}\n", nodePorts{"all", true},
			[]string{"nodePortAddresses:\n    - all"}, ""},
		{"nftables ignores iptables.localhostNodePorts", "mode: nftables\niptables: {localhostNodePorts: true}\n", nodePorts{"primary", false},
			[]string{"localhostNodePorts: false"}, "iptables.localhostNodePorts: ignored"},
		{"all in nftables", "mode: nftables\nnodePortAddresses: [all]\n", nodePorts{"all", false},
			[]string{"- all"}, ""},
		{"primary in iptables", "nodePortAddresses: [primary]\n", nodePorts{"primary", true},
			[]string{"- primary"}, ""},
		{"CIDRs in nftables", "mode: nftables\nnodePortAddresses: [10.0.0.0/8]\n", nodePorts{"10.0.0.0/8", false},
			[]string{"- 10.0.0.0/8"}, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, err := load(t, input{yaml: head + tc.yaml})
			if err != nil {
				t.Fatal(err)
			}
			if got := nodePortsOf(c); got != tc.want {
				t.Errorf("loaded node ports %+v, want %+v", got, tc.want)
			}
			text, warnings, err := ConvertKubeProxy(writeFile(t, head+tc.yaml))
			if err != nil {
				t.Fatal(err)
			}
			for _, w := range tc.written {
				if !strings.Contains(string(text), w) {
					t.Errorf("converted YAML lacks %q:\n%s", w, text)
				}
			}
			if joined := strings.Join(warnings, "|"); (tc.warning == "") != (joined == "") || !strings.Contains(joined, tc.warning) {
				t.Errorf("warnings %q, want %q", warnings, tc.warning)
			}
			// Weir's own file loads to the same node ports.
			path := filepath.Join(t.TempDir(), "weir.yaml")
			if err := os.WriteFile(path, text, 0o600); err != nil {
				t.Fatal(err)
			}
			again, err := load(t, input{args: []string{"--config", path}})
			if err != nil || nodePortsOf(again) != tc.want {
				t.Errorf("the converted file loads as %+v, %v; want %+v", nodePortsOf(again), err, tc.want)
			}
		})
	}
	_, err := load(t, input{yaml: head + "nodePortAddresses: [localhost]\n"})
	var e *Error
	if !errors.As(err, &e) || e.Key != "nodePortAddresses" || !strings.Contains(e.Allowed, "localhost is not supported") {
		t.Errorf("kube-proxy's localhost keyword: got %v, want it refused on nodePortAddresses", err)
	}
}
