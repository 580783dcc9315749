package guest

import (
	"bytes"
	"errors"
	"net/netip"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/weirproxy/weir/sdk/abi"
	"github.com/weirproxy/weir/sdk/plan"
)

func encoded(t *testing.T) []byte {
	t.Helper()
	s := &plan.Service{
		Key:        plan.Key{Namespace: "ns", Name: "web", Protocol: plan.TCP},
		ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.1")},
		Port:       80,
		Endpoints: []plan.Endpoint{
			{Address: netip.MustParseAddr("10.1.0.1"), Port: 8080, Weight: 1},
			{Address: netip.MustParseAddr("10.1.0.2"), Port: 8080, Weight: 1},
		},
	}
	var e abi.Encoder
	return bytes.Clone(e.Encode(plan.Node{Name: "n"}, []*plan.Service{s}, true))
}

func TestProcess(t *testing.T) {
	for _, tc := range []struct {
		name    string
		plugin  Plugin
		input   []byte
		status  abi.Status
		stderr  string
		weight0 uint32
	}{
		{"ok", Plugin{Process: func(b *abi.Batch) error {
			b.Service(0).Endpoint(0).SetWeight(9)
			return nil
		}}, nil, abi.StatusOK, "", 9},
		{"no callback", Plugin{}, nil, abi.StatusOK, "", 1},
		{"handler error", Plugin{Process: func(*abi.Batch) error { return errors.New("zone unknown") }},
			nil, abi.StatusFailed, "zone unknown\n", 0},
		{"panic with a string", Plugin{Process: func(*abi.Batch) error { panic("boom") }},
			nil, abi.StatusPanic, "panic: boom (at ", 0},
		{"panic with an error", Plugin{Process: func(*abi.Batch) error { panic(errors.New("bad")) }},
			nil, abi.StatusPanic, "panic: bad (at ", 0},
		{"runtime panic", Plugin{Process: func(b *abi.Batch) error { b.Service(0).Endpoint(5); return nil }},
			nil, abi.StatusPanic, "panic: abi: endpoint index 5 out of range [0,2) (at ", 0},
		{"nil dereference", Plugin{Process: func(b *abi.Batch) error { var p *plan.Service; _ = p.Port; return nil }},
			nil, abi.StatusPanic, "panic: runtime error: invalid memory address or nil pointer dereference (at ", 0},
		{"panic with another value", Plugin{Process: func(*abi.Batch) error { panic(struct{}{}) }},
			nil, abi.StatusPanic, "panic: (a value that is not an error or string) (at ", 0},
		{"garbage input", Plugin{Process: func(*abi.Batch) error { t.Error("called on garbage"); return nil }},
			[]byte("not a batch at all, clearly, not at all"), abi.StatusBadInput, "bad batch: abi: bad magic", 0},
		{"empty input", Plugin{}, []byte{}, abi.StatusBadInput, "bad batch: abi: batch of 0 bytes is shorter than its header\n", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := tc.input
			if in == nil {
				in = encoded(t)
			}
			var stderr bytes.Buffer
			out, status := Process(tc.plugin, in, &stderr)
			if status != tc.status || !strings.HasPrefix(stderr.String(), strings.TrimSuffix(tc.stderr, "\n")) ||
				strings.HasSuffix(tc.stderr, "\n") && stderr.String() != tc.stderr {
				t.Errorf("got status %v stderr %q; want %v %q", status, stderr.String(), tc.status, tc.stderr)
			}
			if status != abi.StatusOK {
				if out != nil {
					t.Error("output with a failure status")
				}
				return
			}
			if &out[0] != &in[0] {
				t.Error("output is not the input edited in place")
			}
			b, err := abi.Parse(out)
			if err != nil {
				t.Fatal(err)
			}
			if w := b.Service(0).Endpoint(0).Weight(); w != tc.weight0 {
				t.Errorf("weight %d, want %d", w, tc.weight0)
			}
		})
	}
}

func TestConfigure(t *testing.T) {
	type cfg struct {
		Zone string `json:"zone"`
	}
	var got cfg
	strict := Plugin{Configure: func(c []byte) error { got = cfg{}; return DecodeConfig(c, &got) }}
	for _, tc := range []struct {
		name   string
		plugin Plugin
		config string
		status abi.Status
		stderr string
	}{
		{"no callback, null", Plugin{}, "null", abi.StatusOK, ""},
		{"no callback, empty", Plugin{}, " ", abi.StatusOK, ""},
		{"no callback, a config", Plugin{}, `{"a":1}`, abi.StatusBadConfig, "config: this plugin takes no configuration\n"},
		{"strict ok", strict, `{"zone":"z1"}`, abi.StatusOK, ""},
		{"strict null", strict, `null`, abi.StatusOK, ""},
		{"strict empty becomes null", strict, ``, abi.StatusOK, ""},
		{"unknown field", strict, `{"zone":"z1","zones":[]}`, abi.StatusBadConfig, "config: json: unknown field \"zones\"\n"},
		{"trailing data", strict, `{"zone":"z1"} {}`, abi.StatusBadConfig, "config: unexpected data after the JSON value\n"},
		{"wrong type", strict, `{"zone":1}`, abi.StatusBadConfig, "config: json: cannot unmarshal"},
		{"callback error", Plugin{Configure: func([]byte) error { return errors.New("no") }}, "{}", abi.StatusBadConfig, "no\n"},
		{"callback panic", Plugin{Configure: func([]byte) error { panic("cfg boom") }}, "{}", abi.StatusPanic, "panic: cfg boom (at "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stderr bytes.Buffer
			status := Configure(tc.plugin, []byte(tc.config), &stderr)
			if status != tc.status || !strings.HasPrefix(stderr.String(), strings.TrimSuffix(tc.stderr, "\n")) ||
				strings.HasSuffix(tc.stderr, "\n") && stderr.String() != tc.stderr || tc.stderr == "" && stderr.Len() != 0 {
				t.Errorf("got status %v stderr %q; want %v %q", status, stderr.String(), tc.status, tc.stderr)
			}
		})
	}
	Configure(strict, []byte(`{"zone":"z9"}`), nil)
	if got.Zone != "z9" {
		t.Errorf("decoded zone %q, want z9", got.Zone)
	}
	Configure(strict, []byte(`null`), nil)
	if got.Zone != "" {
		t.Errorf("null config: zone %q, want it left alone (zero)", got.Zone)
	}
}

func TestDecodeConfigLeavesValueOnNull(t *testing.T) {
	v := map[string]int{"keep": 1}
	for _, c := range []string{"", "null", "  null\n"} {
		if err := DecodeConfig([]byte(c), &v); err != nil || v["keep"] != 1 {
			t.Errorf("DecodeConfig(%q) = %v, value %v", c, err, v)
		}
	}
}

func TestRegisterTwice(t *testing.T) {
	defer func() { registered = nil }()
	Register(Plugin{})
	defer func() {
		if r := recover(); r != "guest: Register called twice" {
			t.Errorf("second Register: recovered %v", r)
		}
	}()
	Register(Plugin{})
}

// TestPanicSite checks that a recovered panic names the line that
// panicked, not the SDK's recover, and for a panic inside the SDK also the
// plugin's line that called it.
func TestPanicSite(t *testing.T) {
	var site string // file:line of the statement after the runtime.Caller
	here := func() {
		_, file, line, _ := runtime.Caller(1)
		site = file + ":" + strconv.Itoa(line+1)
	}
	for _, tc := range []struct {
		name    string
		process func(b *abi.Batch) error
		want    func() string
	}{
		{"panic", func(*abi.Batch) error {
			here()
			panic("boom")
		}, func() string { return "panic: boom (at " + site + " in guest.TestPanicSite.func" }},
		{"runtime error", func(b *abi.Batch) error {
			var none []int
			here()
			_ = none[b.Len()]
			return nil
		}, func() string {
			return "panic: runtime error: index out of range [1] with length 0 (at " + site + " in "
		}},
		{"inside the SDK", func(b *abi.Batch) error {
			here()
			b.Service(0).Endpoint(7)
			return nil
		}, func() string { return "/abi/view.go:" }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stderr bytes.Buffer
			if _, status := Process(Plugin{Process: tc.process}, encoded(t), &stderr); status != abi.StatusPanic {
				t.Fatalf("status %v", status)
			}
			got := stderr.String()
			if !strings.Contains(got, tc.want()) || strings.Contains(got, "guest.go") {
				t.Errorf("stderr %q lacks %q or names the recover", got, tc.want())
			}
			if tc.name == "inside the SDK" && !strings.Contains(got, ", called from "+site+" in guest.TestPanicSite.func") {
				t.Errorf("stderr %q does not say the SDK was called from %s", got, site)
			}
		})
	}
}
