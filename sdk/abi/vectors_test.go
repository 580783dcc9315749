package abi

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/weirproxy/weir/sdk/plan"
)

var update = flag.Bool("update", false, "rewrite the test vectors in testdata/vectors from the Go encoder")

// vectorsDir holds the ABI's shared test vectors; README.md there describes them.
const vectorsDir = "testdata/vectors"

// hexLimit is the largest batch that also gets a .hex dump.
const hexLimit = 4096

// vecIndex lists the vectors, so an SDK need not list directories.
type vecIndex struct {
	Batches []string `json:"batches"`
	Outputs []string `json:"outputs"`
}

// vecBatch is a batch's decoded content as the vectors' JSON spells it.
type vecBatch struct {
	Comment  string       `json:"comment"`
	Version  uint16       `json:"version"`
	Size     int          `json:"size"`
	Node     vecNodeJSON  `json:"node"`
	Full     bool         `json:"full"`
	Strings  uint32       `json:"stringsOffset"`
	Services []vecService `json:"services"`
}

type vecNodeJSON struct {
	Name string `json:"name"`
	Zone string `json:"zone"`
}

type vecService struct {
	Offset              uint32        `json:"offset"`
	Size                uint32        `json:"size"`
	Namespace           string        `json:"namespace"`
	Name                string        `json:"name"`
	PortName            string        `json:"portName"`
	Protocol            string        `json:"protocol"`
	ProtocolCode        uint8         `json:"protocolCode"`
	Scheduler           string        `json:"scheduler"`
	SchedulerCode       uint8         `json:"schedulerCode"`
	Flags               uint16        `json:"flags"`
	ExternalLocal       bool          `json:"externalLocal"`
	InternalLocal       bool          `json:"internalLocal"`
	Port                uint16        `json:"port"`
	NodePort            uint16        `json:"nodePort"`
	HealthCheckNodePort uint16        `json:"healthCheckNodePort"`
	AffinitySeconds     uint32        `json:"affinitySeconds"`
	ClusterIPs          []string      `json:"clusterIPs"`
	ExternalIPs         []string      `json:"externalIPs"`
	LoadBalancerIPs     []string      `json:"loadBalancerIPs"`
	SourceRanges        []string      `json:"sourceRanges"`
	Labels              []vecPair     `json:"labels"`
	Annotations         []vecPair     `json:"annotations"`
	EndpointsOffset     uint32        `json:"endpointsOffset"`
	Endpoints           []vecEndpoint `json:"endpoints"`
}

type vecPair struct {
	Key   string `json:"key"`
	Value string `json:"value"`
}

type vecEndpoint struct {
	ID          uint32 `json:"id"`
	Address     string `json:"address"`
	Port        uint16 `json:"port"`
	Flags       uint16 `json:"flags"`
	Ready       bool   `json:"ready"`
	Serving     bool   `json:"serving"`
	Terminating bool   `json:"terminating"`
	Local       bool   `json:"local"`
	ForCluster  bool   `json:"forCluster"`
	ForLocal    bool   `json:"forLocal"`
	Weight      uint32 `json:"weight"`
	NodeName    string `json:"nodeName"`
	Zone        string `json:"zone"`
	Pod         string `json:"pod"`
	Active      uint32 `json:"active"`
	New         uint32 `json:"new"`
}

// vecOutput is an output vector: edits to an input batch and their result.
type vecOutput struct {
	Comment string      `json:"comment"`
	Input   string      `json:"input"`
	Edits   []vecEdit   `json:"edits"`
	Size    int         `json:"size"`
	Result  []vecResult `json:"result"`
}

// vecResult is what Weir takes from one service of an output.
type vecResult struct {
	Changed         bool        `json:"changed"`
	AffinitySeconds uint32      `json:"affinitySeconds"`
	Scheduler       string      `json:"scheduler"`
	Endpoints       []vecWeight `json:"endpoints"`
}

type vecWeight struct {
	ID     uint32 `json:"id"`
	Weight uint32 `json:"weight"`
}

// TestVectors checks the Go SDK against the shared vectors byte for byte:
// the encoder writes every .bin, decoding it gives its .json, and the edits
// of every output vector, made through the views, give its .bin. With
// -update it rewrites the vectors instead.
func TestVectors(t *testing.T) {
	files := vectorFiles(t)
	if *update {
		writeVectors(t, files)
		return
	}
	for name, want := range files {
		got, err := os.ReadFile(filepath.Join(vectorsDir, name))
		if err != nil {
			t.Errorf("%v (run go test ./abi/ -run TestVectors -update)", err)
			continue
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s differs from what the Go SDK makes (%d bytes, want %d); run with -update if the change is intended", name, len(got), len(want))
		}
	}
	checkNoStrayVectors(t, files)
}

// TestVectorsDecode checks that decoding each committed batch gives back the
// services it was encoded from.
func TestVectorsDecode(t *testing.T) {
	for _, c := range batchCases() {
		buf, err := os.ReadFile(filepath.Join(vectorsDir, "batches", c.name+".bin"))
		if err != nil {
			t.Fatal(err)
		}
		node, got, full, err := DecodeBatch(buf)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if node.Name != c.node.Name || node.Zone != c.node.Zone || full != c.full || len(got) != len(c.services) {
			t.Fatalf("%s: node %+v full %v with %d services, want %+v %v %d", c.name, node, full, len(got), c.node, c.full, len(c.services))
		}
		for i, want := range c.services {
			if !got[i].Equal(want) {
				t.Errorf("%s: service %d:\n got %s\nwant %s", c.name, i, got[i], want)
			}
		}
	}
}

// vectorFiles makes every vector file, keyed by its path under vectorsDir.
func vectorFiles(t *testing.T) map[string][]byte {
	t.Helper()
	files := map[string][]byte{}
	inputs := map[string]batchCase{}
	var index vecIndex
	for _, c := range batchCases() {
		var e Encoder
		buf := slices.Clone(e.Encode(c.node, c.services, c.full))
		if c.signals != nil {
			buf = slices.Clone(e.EncodeSignals(c.node, c.services, c.full, c.signals))
		}
		inputs[c.name] = c
		files["batches/"+c.name+".bin"] = buf
		files["batches/"+c.name+".json"] = marshal(t, batchJSON(t, c.comment, buf))
		if len(buf) <= hexLimit {
			files["batches/"+c.name+".hex"] = hexDump(buf)
		}
		index.Batches = append(index.Batches, c.name)
	}
	for _, c := range outputCases() {
		in, ok := inputs[c.input]
		if !ok {
			t.Fatalf("output %s: no batch %q", c.name, c.input)
		}
		out, result := applyEdits(t, c, files["batches/"+c.input+".bin"], in.services)
		files["outputs/"+c.name+".bin"] = out
		files["outputs/"+c.name+".json"] = marshal(t, vecOutput{
			Comment: c.comment, Input: c.input, Edits: nonNil(c.edits), Size: len(out), Result: result,
		})
		index.Outputs = append(index.Outputs, c.name)
	}
	files["index.json"] = marshal(t, index)
	return files
}

// batchJSON decodes buf through the views into the vectors' JSON form.
func batchJSON(t *testing.T, comment string, buf []byte) vecBatch {
	t.Helper()
	b, err := Parse(slices.Clone(buf))
	if err != nil {
		t.Fatal(err)
	}
	v := vecBatch{
		Comment: comment, Version: b.Version(), Size: len(buf), Full: b.Full(), Strings: u32(buf, hStrings),
		Node:     vecNodeJSON{Name: b.NodeName(), Zone: b.NodeZone()},
		Services: make([]vecService, b.Len()),
	}
	for i := range v.Services {
		v.Services[i] = serviceJSON(b.Service(i))
	}
	return v
}

func serviceJSON(s Service) vecService {
	b, off, sh := s.buf, s.off, s.shape()
	v := vecService{
		Offset: uint32(off), Size: u32(b, off+sSize),
		Namespace: s.Namespace(), Name: s.Name(), PortName: s.PortName(),
		Protocol: string(s.Protocol()), ProtocolCode: b[off+sProtocol],
		Scheduler: string(s.Scheduler()), SchedulerCode: b[off+sScheduler],
		Flags: u16(b, off+sFlags), ExternalLocal: s.ExternalLocal(), InternalLocal: s.InternalLocal(),
		Port: s.Port(), NodePort: s.NodePort(), HealthCheckNodePort: s.HealthCheckNodePort(),
		AffinitySeconds: s.AffinitySeconds(),
		ClusterIPs:      texts(s.ClusterIPs()), ExternalIPs: texts(s.ExternalIPs()),
		LoadBalancerIPs: texts(s.LoadBalancerIPs()), SourceRanges: texts(s.SourceRanges()),
		Labels:          pairsJSON(b, off+sh.pairsOff(), sh.labels),
		Annotations:     pairsJSON(b, off+sh.pairsOff()+pairSize*sh.labels, sh.annotations),
		EndpointsOffset: u32(b, off+sEndpointsOff),
		Endpoints:       make([]vecEndpoint, s.Len()),
	}
	for j := range v.Endpoints {
		v.Endpoints[j] = endpointJSON(s.Endpoint(j))
	}
	return v
}

func endpointJSON(e Endpoint) vecEndpoint {
	return vecEndpoint{
		ID: e.ID(), Address: e.Address().String(), Port: e.Port(), Flags: u16(e.rec, eFlags),
		Ready: e.Ready(), Serving: e.Serving(), Terminating: e.Terminating(), Local: e.Local(),
		ForCluster: e.ForCluster(), ForLocal: e.ForLocal(), Weight: e.Weight(),
		NodeName: e.NodeName(), Zone: e.Zone(), Pod: e.Pod(), Active: e.Active(), New: e.New(),
	}
}

// pairsJSON reads n key/value pairs at off, in their order in the batch.
func pairsJSON(b []byte, off, n int) []vecPair {
	out := make([]vecPair, n)
	for i := range out {
		p := off + pairSize*i
		out[i] = vecPair{Key: strAt(b, p), Value: strAt(b, p+strSize)}
	}
	return out
}

func texts[T fmt.Stringer](xs []T) []string {
	out := make([]string, len(xs))
	for i, x := range xs {
		out[i] = x.String()
	}
	return out
}

func nonNil(e []vecEdit) []vecEdit {
	if e == nil {
		return []vecEdit{}
	}
	return e
}

// applyEdits makes c's edits to a copy of batch through the views, checks
// the output with Decode as Weir does, and returns it with its result.
func applyEdits(t *testing.T, c outputCase, batch []byte, in []*plan.Service) ([]byte, []vecResult) {
	t.Helper()
	b, err := Parse(slices.Clone(batch))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range c.edits {
		if err := applyEdit(b.Service(e.Service), e); err != nil {
			t.Fatalf("output %s: %s: %v", c.name, e.Op, err)
		}
	}
	used, err := DecodeVersion(b.Version(), in, b.Bytes())
	if err != nil {
		t.Fatalf("output %s: Weir rejects it: %v", c.name, err)
	}
	result := make([]vecResult, b.Len())
	for i := range result {
		s := b.Service(i)
		r := vecResult{Changed: used[i] != in[i], AffinitySeconds: s.AffinitySeconds(),
			Scheduler: string(s.Scheduler()), Endpoints: make([]vecWeight, s.Len())}
		for j := range r.Endpoints {
			r.Endpoints[j] = vecWeight{ID: s.Endpoint(j).ID(), Weight: s.Endpoint(j).Weight()}
			if want := in[i].Endpoints[r.Endpoints[j].ID]; used[i].Endpoints[j].Address != want.Address {
				t.Fatalf("output %s: service %d slot %d: Decode disagrees with the ids", c.name, i, j)
			}
		}
		result[i] = r
	}
	return b.Bytes(), result
}

// applyEdit makes one edit through the Go views.
func applyEdit(s Service, e vecEdit) error {
	arg := func(i int) uint32 { return e.Args[i] }
	switch e.Op {
	case opSetWeight:
		s.Endpoint(int(arg(0))).SetWeight(arg(1))
	case opSwap:
		s.Swap(int(arg(0)), int(arg(1)))
	case opKeep:
		s.Keep(func(ep Endpoint) bool { return slices.Contains(e.Args, ep.ID()) })
	case opSortByWeightDesc:
		s.SortEndpoints(func(a, b Endpoint) bool { return a.Weight() > b.Weight() })
	case opSetAffinity:
		s.SetAffinity(arg(0))
	case opSetScheduler:
		return s.SetScheduler(plan.Schedulers[arg(0)])
	default:
		return fmt.Errorf("unknown op %q", e.Op)
	}
	return nil
}

// marshal formats v as indented JSON ending in a newline, without HTML escaping.
func marshal(t *testing.T, v any) []byte {
	t.Helper()
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// hexDump formats buf as `hexdump -C` does, without collapsing repeated lines.
func hexDump(buf []byte) []byte {
	var out strings.Builder
	for off := 0; off < len(buf); off += 16 {
		line := buf[off:min(off+16, len(buf))]
		fmt.Fprintf(&out, "%08x ", off)
		for i := range 16 {
			if i == 8 {
				out.WriteByte(' ')
			}
			if i < len(line) {
				fmt.Fprintf(&out, " %02x", line[i])
			} else {
				out.WriteString("   ")
			}
		}
		out.WriteString("  |")
		for _, c := range line {
			if c < 0x20 || c > 0x7e {
				c = '.'
			}
			out.WriteByte(c)
		}
		out.WriteString("|\n")
	}
	fmt.Fprintf(&out, "%08x\n", len(buf))
	return []byte(out.String())
}

// writeVectors replaces the vectors directory's generated files with files.
func writeVectors(t *testing.T, files map[string][]byte) {
	t.Helper()
	for _, dir := range []string{"batches", "outputs"} {
		if err := os.RemoveAll(filepath.Join(vectorsDir, dir)); err != nil {
			t.Fatal(err)
		}
	}
	for name, data := range files {
		path := filepath.Join(vectorsDir, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// checkNoStrayVectors fails for a file in batches/ or outputs/ that the cases no longer make.
func checkNoStrayVectors(t *testing.T, files map[string][]byte) {
	t.Helper()
	for _, dir := range []string{"batches", "outputs"} {
		entries, err := os.ReadDir(filepath.Join(vectorsDir, dir))
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			if _, ok := files[dir+"/"+e.Name()]; !ok {
				t.Errorf("%s/%s is no vector the cases make; run with -update", dir, e.Name())
			}
		}
	}
}
