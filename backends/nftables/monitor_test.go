package nftables

import (
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/weirproxy/weir/test/netns"
)

// elementEvent is one set element the kernel reported as added or deleted.
// The notification does not name the set, so elements are told apart by
// their shape.
type elementEvent struct {
	added    bool
	key, val []byte
}

func (e elementEvent) String() string {
	verb := "delete"
	if e.added {
		verb = "add"
	}
	return fmt.Sprintf("%s element key %x value %x", verb, e.key, e.val)
}

// bucketOf reports whether the element is a bucket of one of the entry
// keys: key "entry key . bucket", value "address . port".
func (e elementEvent) bucketOf(keys ...[]byte) bool {
	for _, k := range keys {
		if len(e.key) == len(k)+4 && string(e.key[:len(k)]) == string(k) && len(e.val) == 8 {
			return true
		}
	}
	return false
}

// hairpinOf reports whether the element is a hairpin entry of one of
// addrs: key "address . address . proto . port", no value.
func (e elementEvent) hairpinOf(addrs ...netip.Addr) bool {
	if len(e.key) != 16 || len(e.val) != 0 || string(e.key[:4]) != string(e.key[4:8]) {
		return false
	}
	for _, a := range addrs {
		b := a.As4()
		if string(e.key[:4]) == string(b[:]) {
			return true
		}
	}
	return false
}

// watchElements subscribes to the node's nftables notifications and sends
// the element changes of the next transaction (generation) on the channel;
// any table, chain, rule or set change in it fails the test.
func watchElements(t *testing.T, topo *netns.Topology) <-chan []elementEvent {
	t.Helper()
	conn, err := nftables.New(nftables.WithNetNSFd(topo.Node.Fd()))
	if err != nil {
		t.Fatal(err)
	}
	mon := nftables.NewMonitor()
	t.Cleanup(func() { mon.Close() })
	ch, err := conn.AddGenerationalMonitor(mon)
	if err != nil {
		t.Fatal(err)
	}
	out := make(chan []elementEvent, 1)
	go func() {
		select {
		case gen := <-ch:
			out <- elementEvents(t, gen)
		case <-time.After(10 * time.Second):
			t.Error("no nftables notification within 10s")
			out <- nil
		}
	}()
	return out
}

func elementEvents(t *testing.T, gen *nftables.MonitorEvents) []elementEvent {
	var out []elementEvent
	if gen == nil {
		return nil
	}
	for _, ev := range gen.Changes {
		switch ev.Type {
		case nftables.MonitorEventTypeNewSetElem, nftables.MonitorEventTypeDelSetElem:
			elems, _ := ev.Data.([]nftables.SetElement)
			for _, el := range elems {
				out = append(out, elementEvent{added: ev.Type == nftables.MonitorEventTypeNewSetElem, key: el.Key, val: el.Val})
			}
		default:
			t.Errorf("one-service transaction changed more than elements: event type %d", ev.Type)
		}
	}
	return out
}
