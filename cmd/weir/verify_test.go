package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

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
