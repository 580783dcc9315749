package nftables

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/nftables"
	"github.com/weirproxy/weir/backends"
	"github.com/weirproxy/weir/test/netns"
	"golang.org/x/sys/unix"
)

// TestKernelRefusalNamesTheMessage commits batches the kernel refuses in
// part: the commit fails with the errno, naming each refused message (the
// first three), whether the refused message is the last of the batch,
// whose answer the commit waits for, or not; and the batch changes
// nothing.
func TestKernelRefusalNamesTheMessage(t *testing.T) {
	netns.RequireRoot(t)
	topo := netns.NewT(t, netns.Options{})
	k, err := newNetlinkKernel(Options{Common: backends.Common{NetNS: topo.Node.Fd()}, Table: "weir-probe"}.withDefaults())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { k.close() })
	l := probeLayout
	set := l.set("addrs", nftables.TypeIPAddr)
	if err := sendOps(k, []op{{kind: opAddTable}, {kind: opAddSet, set: set}}); err != nil {
		t.Fatal(err)
	}
	elems := func(kind opKind, addr string) op {
		return op{kind: kind, set: set, elems: newElemList(l.table, set.Name, kind == opDelElems).addAll(probeElem(addr))}
	}
	// Each op's list is a message of its own.
	missing := func() op { return elems(opDelElems, "10.0.0.1") }
	added := func() op { return elems(opAddElems, "10.0.0.2") }
	const named = "delete elements of set addrs of table ip weir-probe: no such file or directory"
	for _, c := range []struct {
		name string
		ops  []op
		want []string
	}{
		{"the last refused", []op{added(), missing()}, []string{"message 3 of the batch: " + named}},
		{"the first refused", []op{missing(), added()}, []string{"message 2 of the batch: " + named}},
		{"five refused", []op{missing(), missing(), added(), missing(), missing(), missing()},
			[]string{"message 2 of the batch: " + named, "message 3 of the batch: " + named, "message 5 of the batch: " + named, "and 2 more"}},
	} {
		before, err := k.generation()
		if err != nil {
			t.Fatal(err)
		}
		err = sendOps(k, c.ops)
		if !errors.Is(err, unix.ENOENT) {
			t.Fatalf("%s: %v, want ENOENT", c.name, err)
		}
		if got := err.Error(); !strings.HasSuffix(got, strings.Join(c.want, "\n")) {
			t.Errorf("%s: the error reads\n%s\nwant it to end with\n%s", c.name, got, strings.Join(c.want, "\n"))
		}
		if after, err := k.generation(); err != nil || after != before {
			t.Errorf("%s: the generation moved from %d to %d (%v): the refused batch changed something", c.name, before, after, err)
		}
	}
	// 10.0.0.2 was never added: deleting it is refused too.
	if err := sendOps(k, []op{elems(opDelElems, "10.0.0.2")}); !errors.Is(err, unix.ENOENT) {
		t.Errorf("deleting the element the refused batches carried: %v, want ENOENT", err)
	}
}
