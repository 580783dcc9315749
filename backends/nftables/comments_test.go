package nftables

import (
	"strings"
	"testing"

	"github.com/google/nftables"
	"github.com/google/nftables/userdata"
	"github.com/weirproxy/weir/sdk/plan"
)

var v4Table = &nftables.Table{Name: "weir", Family: nftables.TableFamilyIPv4}

// TestCommentsAreBounded checks that the comment of a service port with
// the longest names Kubernetes allows is cut to what nft writes, keeping
// namespace/name first (an external element's keeps its mark last), and
// that comments encode as the nft tool's TLV; and that ReadBack tells
// external elements by the comment's last word, also in tables whose
// comment is that word alone.
func TestCommentsAreBounded(t *testing.T) {
	long := plan.Key{Namespace: strings.Repeat("n", 63), Name: strings.Repeat("s", 63), Port: strings.Repeat("p", 15), Protocol: plan.SCTP}
	short := plan.Key{Namespace: "default", Name: "web", Port: "http", Protocol: plan.TCP}
	for _, k := range []plan.Key{short, long} {
		port, ext := portComment(k), externalComment(portComment(k))
		if len(port) > maxComment || !strings.HasPrefix(port, k.Namespace+"/"+k.Name+":") {
			t.Errorf("%s: comment %q (%d bytes) is longer than %d or does not start with namespace/name", k, port, len(port), maxComment)
		}
		if cut, ok := strings.CutSuffix(ext, " "+externalMark); len(ext) > maxComment || !ok || !strings.HasPrefix(port, cut) {
			t.Errorf("%s: external comment %q (%d bytes) is longer than %d or not the port's, cut, then %q", k, ext, len(ext), maxComment, externalMark)
		}
		for _, c := range []string{port, ext} {
			l := newElemList(v4Table, setNoEPIPs, false)
			l.add(&element{key: ipKey(vip, plan.TCP, 80), comment: c})
			got := l.elements()
			if len(got) != 1 || got[0].comment != c {
				t.Errorf("%s: comment %q decodes as %+v", k, c, got)
			}
		}
		if isExternal(port) || !isExternal(ext) {
			t.Errorf("%s: isExternal(%q) = %t, isExternal(%q) = %t; want false, true", k, port, isExternal(port), ext, isExternal(ext))
		}
	}
	if short := portComment(short); short != "default/web:http/TCP" {
		t.Errorf("portComment = %q, want the key as plan.Key.String prints it", short)
	}
	if isExternal("default/external") {
		t.Error(`isExternal("default/external") = true: a comment cut after a name ending in "external" reads as an external element's`)
	}
	if !isExternal(externalMark) {
		t.Errorf("isExternal(%q) = false: tables written before comments named service ports are misread", externalMark)
	}
	// The nft tool's TLV: type NFTNL_UDATA_SET_ELEM_COMMENT, length, the
	// NUL-terminated string.
	l := newElemList(v4Table, setNoEPIPs, false)
	l.add(&element{key: ipKey(vip, plan.TCP, 80), comment: "default/web:http/TCP"})
	want := userdata.AppendString(nil, userdata.NFTNL_UDATA_SET_ELEM_COMMENT, "default/web:http/TCP")
	if !strings.Contains(string(l.s.bytes()), string(want)) {
		t.Errorf("the element's bytes %x lack the comment TLV %x", l.s.bytes(), want)
	}
}
