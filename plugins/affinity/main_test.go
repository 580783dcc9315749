package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/weirproxy/weir/plugins/internal/examples"
	"github.com/weirproxy/weir/sdk/plan"
	"github.com/weirproxy/weir/sdk/sdktest"
)

var node = plan.Node{Name: "node-1", Zone: "zone-a"}

// service returns default/web with the given annotations (key=value pairs),
// an existing affinity timeout (0 = none) and scheduler.
func service(seconds uint32, sched plan.Scheduler, kv ...string) *plan.Service {
	s := sdktest.Service("default", "web", "10.96.0.10", 80, sdktest.Endpoint("10.0.0.1", 8080, "node-1", "zone-a", "web-1"))
	if seconds > 0 {
		s.Affinity = &plan.Affinity{TimeoutSeconds: seconds}
	}
	s.Scheduler = sched
	s.Annotations = map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		s.Annotations[kv[i]] = kv[i+1]
	}
	return s
}

func timeout(s *plan.Service) uint32 {
	if s.Affinity == nil {
		return 0
	}
	return s.Affinity.TimeoutSeconds
}

func captureLog(t *testing.T) *bytes.Buffer {
	var buf bytes.Buffer
	old := logOut
	logOut = &buf
	t.Cleanup(func() { logOut = old })
	return &buf
}

func TestAnnotations(t *testing.T) {
	const ip, sch = clientIPAnnotation, schedulerAnnotation
	tests := []struct {
		name    string
		config  string
		in      *plan.Service
		seconds uint32
		sched   plan.Scheduler
		same    bool // the service must come back unchanged
	}{
		{"no annotations", "", service(0, ""), 0, "", true},
		{"true", "", service(0, "", ip, "true"), 10800, "", false},
		{"on", "", service(0, "", ip, "on"), 10800, "", false},
		{"case and spaces", "", service(0, "", ip, " TRUE "), 10800, "", false},
		{"true keeps the service's own timeout", "", service(300, "", ip, "true"), 300, "", true},
		{"configured default", `{"defaultTimeoutSeconds":60}`, service(0, "", ip, "on"), 60, "", false},
		{"false clears", "", service(300, "", ip, "false"), 0, "", false},
		{"off clears", "", service(300, "", ip, "Off"), 0, "", false},
		{"false without affinity", "", service(0, "", ip, "false"), 0, "", true},
		{"minutes", "", service(0, "", ip, "30m"), 1800, "", false},
		{"seconds", "", service(0, "", ip, "600s"), 600, "", false},
		{"bare seconds", "", service(0, "", ip, "600"), 600, "", false},
		{"compound", "", service(0, "", ip, "1h30m"), 5400, "", false},
		{"overrides the service's timeout", "", service(300, "", ip, "1h"), 3600, "", false},
		{"longest", "", service(0, "", ip, "24h"), 86400, "", false},
		{"shortest", "", service(0, "", ip, "1"), 1, "", false},
		{"scheduler", "", service(0, "", sch, "sh"), 0, plan.SchedulerSourceHash, false},
		{"scheduler upper case", "", service(0, "", sch, "MH"), 0, plan.SchedulerMaglevHash, false},
		{"scheduler default", "", service(0, plan.SchedulerRoundRobin, sch, "default"), 0, "", false},
		{"scheduler empty is default", "", service(0, plan.SchedulerRoundRobin, sch, ""), 0, "", false},
		{"both", "", service(0, "", ip, "on", sch, "lc"), 10800, plan.SchedulerLeastConnection, false},
		{"configured scheduler with affinity", `{"scheduler":"sh"}`, service(0, "", ip, "10m"), 600, plan.SchedulerSourceHash, false},
		{"configured scheduler needs affinity on", `{"scheduler":"sh"}`, service(300, "", ip, "off"), 0, "", false},
		{"configured scheduler needs the annotation", `{"scheduler":"sh"}`, service(300, ""), 300, "", true},
		{"annotation beats configured scheduler", `{"scheduler":"sh"}`, service(0, "", ip, "on", sch, "rr"), 10800, plan.SchedulerRoundRobin, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			log := captureLog(t)
			out, err := sdktest.Run(plugin, tt.config, node, tt.in)
			if err != nil {
				t.Fatal(err)
			}
			if log.Len() > 0 {
				t.Errorf("unexpected log %q", log)
			}
			if got := out[0]; timeout(got) != tt.seconds || got.Scheduler != tt.sched || (got == tt.in) != tt.same {
				t.Fatalf("affinity %d scheduler %q unchanged %v, want %d %q %v",
					timeout(got), got.Scheduler, got == tt.in, tt.seconds, tt.sched, tt.same)
			}
		})
	}
}

func TestBadAnnotation(t *testing.T) {
	tests := []struct{ key, value, reason string }{
		{clientIPAnnotation, "86401", "longer than 86400s"},
		{clientIPAnnotation, "25h", "longer than 86400s"},
		{clientIPAnnotation, "0", "at least 1s"},
		{clientIPAnnotation, "0s", "at least 1s"},
		{clientIPAnnotation, "-5s", "at least 1s"},
		{clientIPAnnotation, "1500ms", "whole number of seconds"},
		{clientIPAnnotation, "yes", "not true, on, false"},
		{clientIPAnnotation, "", "not true, on, false"},
		{clientIPAnnotation, "99999999999999999999", "longer than 86400s"},
		{clientIPAnnotation, "99999999999", "longer than 86400s"},
		{clientIPAnnotation, "1.5", "not true, on, false"},
		{schedulerAnnotation, "fifo", `unknown scheduler "fifo"`},
	}
	for _, tt := range tests {
		t.Run(tt.key+"="+tt.value, func(t *testing.T) {
			log := captureLog(t)
			// The other annotation is valid: a bad one still leaves everything alone.
			kv := []string{clientIPAnnotation, "on", schedulerAnnotation, "sh"}
			if tt.key == clientIPAnnotation {
				kv[1] = tt.value
			} else {
				kv[3] = tt.value
			}
			in := service(300, plan.SchedulerRoundRobin, kv...)
			out, err := sdktest.Run(plugin, "", node, in)
			if err != nil {
				t.Fatal(err)
			}
			if out[0] != in {
				t.Fatalf("service changed")
			}
			line := log.String()
			if !strings.HasPrefix(line, in.Key.String()+": annotation "+tt.key+"=") ||
				!strings.Contains(line, tt.reason) || strings.Count(line, "\n") != 1 {
				t.Fatalf("log %q, want one line naming the service and %q", line, tt.reason)
			}
		})
	}
}

func TestBatch(t *testing.T) {
	captureLog(t)
	bad := service(0, "", clientIPAnnotation, "forever")
	good := service(0, "", clientIPAnnotation, "5m")
	good.Key.Name = "good"
	out, err := sdktest.Run(plugin, "", node, bad, good)
	if err != nil {
		t.Fatal(err)
	}
	if out[0] != bad || timeout(out[1]) != 300 {
		t.Fatalf("got %d and %d", timeout(out[0]), timeout(out[1]))
	}
}

func TestBadConfig(t *testing.T) {
	in := service(0, "")
	for _, c := range []string{
		`{"defaultTimeoutSeconds":0}`, `{"defaultTimeoutSeconds":86401}`, `{"defaultTimeoutSeconds":-1}`,
		`{"defaultTimeoutSeconds":"1h"}`, `{"scheduler":"fifo"}`, `{"timeout":5}`,
	} {
		if _, err := sdktest.Run(plugin, c, node, in); err == nil {
			t.Errorf("config %s accepted", c)
		}
	}
	for _, c := range []string{"", "{}", `{"defaultTimeoutSeconds":86400,"scheduler":"default"}`, `{"scheduler":"WRR"}`} {
		if _, err := sdktest.Run(plugin, c, node, in); err != nil {
			t.Errorf("config %s: %v", c, err)
		}
	}
}

// TestExampleConfig checks that the config of config.yaml's entry is accepted.
func TestExampleConfig(t *testing.T) { examples.ExampleConfig(t, plugin, node) }
