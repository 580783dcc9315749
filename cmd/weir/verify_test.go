package main

import (
	"bytes"
	"encoding/json"
	"net/netip"
	"strings"
	"testing"

	"github.com/weirproxy/weir/backends"
	"github.com/weirproxy/weir/sdk/plan"
)

func TestVerifyUsage(t *testing.T) {
	for _, args := range [][]string{
		{"verify", "--source-path", "testdata/manifests", "-o", "yaml"},
		{"verify", "--source-path", "testdata/manifests", "--timeout", "0s"},
		{"verify", "--source-path", "testdata/manifests", "extra"},
	} {
		code, stdout, stderr := invoke(t, args...)
		if code != exitUsage || stdout != "" {
			t.Errorf("weir %s: exit %d, stdout %q; want %d and nothing\nstderr:\n%s", strings.Join(args, " "), code, stdout, exitUsage, stderr)
		}
	}
}

func TestWriteVerify(t *testing.T) {
	res := &verifyResult{Mode: "nftables", Services: 2, Destinations: 3, Kept: []string{"default/b:http/TCP"},
		Divergences: []verifyDivergence{{Service: "default/a:http/TCP", Field: "endpoints", Got: "none",
			Message: "default/a:http/TCP (cluster IP 10.96.0.1:80/TCP): endpoints: want 10.0.0.1:80*1, got none"}}}
	var text bytes.Buffer
	if err := writeVerify(&text, "text", res); err != nil {
		t.Fatal(err)
	}
	want := "default/a:http/TCP (cluster IP 10.96.0.1:80/TCP): endpoints: want 10.0.0.1:80*1, got none\n" +
		"not compared: default/b:http/TCP (a closed-policy plugin failed for it; the kernel keeps its last rules)\n" +
		"nftables: 2 services, 3 destinations: 1 divergence between the plan and the kernel\n"
	if text.String() != want {
		t.Errorf("text report:\n%s\nwant:\n%s", text.String(), want)
	}
	var js bytes.Buffer
	if err := writeVerify(&js, "json", res); err != nil {
		t.Fatal(err)
	}
	var back verifyResult
	if err := json.Unmarshal(js.Bytes(), &back); err != nil || back.Divergences[0].Field != "endpoints" || back.Kept[0] != "default/b:http/TCP" {
		t.Errorf("JSON report %s: %+v, %v", js.String(), back, err)
	}
	res.Divergences, res.Kept = []verifyDivergence{}, nil
	text.Reset()
	if err := writeVerify(&text, "text", res); err != nil || text.String() != "nftables: 2 services, 3 destinations: the kernel matches the plan\n" {
		t.Errorf("clean text report %q, %v", text.String(), err)
	}
}

func TestKeptServices(t *testing.T) {
	a := &plan.Service{Key: plan.Key{Namespace: "default", Name: "a", Port: "http", Protocol: plan.TCP}}
	b := &plan.Service{Key: plan.Key{Namespace: "default", Name: "b", Port: "http", Protocol: plan.TCP}}
	planned := &plan.Plan{Services: map[plan.Key]*plan.Service{a.Key: a, b.Key: b}}
	final := &plan.Plan{Services: map[plan.Key]*plan.Service{a.Key: a}}
	_, kept := keptServices(planned, final)
	if len(kept.Services) != 1 || kept.Services[b.Key] != b {
		t.Errorf("kept %v, want only %s (planned, without a final service)", kept.Keys(), b.Key)
	}
}

// TestLeaveKeptOut: with a kept service, the divergences at its planned
// destinations and the destinations no planned service owns are not
// counted; the rest is.
func TestLeaveKeptOut(t *testing.T) {
	k := plan.Key{Namespace: "default", Name: "kept", Port: "http", Protocol: plan.TCP}
	other := plan.Key{Namespace: "default", Name: "other", Port: "http", Protocol: plan.TCP}
	vip := netip.MustParseAddr("10.96.0.1")
	kept := &plan.Plan{Services: map[plan.Key]*plan.Service{k: {Key: k, ClusterIPs: []netip.Addr{vip}, Port: 81}}}
	planned := backends.Destination{Kind: backends.DestCluster, Addr: vip, Protocol: plan.TCP, Port: 81}
	keptView := &backends.View{Destinations: map[backends.Destination]backends.Forwarding{planned: {}}}
	earlier := backends.Destination{Kind: backends.DestExternal, Addr: netip.MustParseAddr("198.18.0.1"), Protocol: plan.TCP, Port: 80}
	otherVIP := backends.Destination{Kind: backends.DestCluster, Addr: netip.MustParseAddr("10.96.0.9"), Protocol: plan.TCP, Port: 80}
	divs := []backends.Divergence{
		{Service: k, Destination: planned, Field: "destination", Want: "present (forward)", Got: "missing"},
		{Destination: earlier, Field: "destination", Want: "absent", Got: "present (forward)"},
		{Service: other, Destination: otherVIP, Field: "destination", Want: "present (forward)", Got: "missing"},
		{Service: other, Destination: otherVIP, Field: "endpoints"},
		{Field: "anomaly", Got: "something"},
	}
	count, skipped := leaveKeptOut(divs, kept, keptView)
	if len(count) != 3 || count[0].Service != other || count[1].Service != other || count[2].Field != "anomaly" {
		t.Errorf("counted %v", count)
	}
	if len(skipped) != 1 || skipped[0].Destination != earlier {
		t.Errorf("left out %v", skipped)
	}
	if c, s := leaveKeptOut(divs, &plan.Plan{}, &backends.View{}); len(c) != len(divs) || s != nil {
		t.Errorf("without kept services every divergence counts: %v, %v", c, s)
	}
}
