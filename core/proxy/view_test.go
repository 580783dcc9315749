package proxy_test

import (
	"context"
	"errors"
	"testing"
)

func TestServiceViewAndSyncStatus(t *testing.T) {
	p, be, _ := newProxy(t)
	h := p.Handler()
	h.OnService(nil, service("web", "10.96.0.10", svcPort("http", 80)))
	eps := endpointSlice("web-1", "web", ports(epPort("http", 8080)), "10.244.0.11")
	h.OnEndpointSlice(nil, eps)
	h.OnService(nil, service("bad", "10.96.0.300", svcPort("http", 80)))
	h.OnSynced()
	if err := p.Sync(context.Background(), true); err != nil {
		t.Fatal(err)
	}
	v := p.Service("default/web")
	if len(v.Planned) != 1 || len(v.Final) != 1 || len(v.Final[0].Endpoints) != 1 {
		t.Fatalf("Service(default/web) = %+v, want one planned and final port with its endpoint", v)
	}
	first, ok := v.Committed[key("web", "http").String()]
	if !ok || first.IsZero() {
		t.Fatalf("Committed = %v, want the port's commit time", v.Committed)
	}
	if got := p.Service("default/bad"); len(got.Planned) != 0 || len(got.Problems) != 1 {
		t.Errorf("Service(default/bad) = %+v, want no ports and its problem", got)
	}
	if got := p.ServiceNames(); len(got) != 1 || got[0] != "default/web" {
		t.Errorf("ServiceNames() = %q, want [default/web]", got)
	}
	st := p.SyncStatus()
	if !st.Full || st.Error != "" || st.Failures != 0 || st.LastSuccess.IsZero() || st.Services != 1 {
		t.Errorf("SyncStatus after a good sync = %+v", st)
	}

	be.failNextSync(errors.New("kernel said no"))
	h.OnEndpointSlice(eps, withAddrs(eps, "10.244.0.12"))
	if err := p.Sync(context.Background(), false); err == nil {
		t.Fatal("the failing sync succeeded")
	}
	st = p.SyncStatus()
	if st.Failures != 1 || st.Error != "kernel said no" || st.LastSuccess.After(st.Last) {
		t.Errorf("SyncStatus after a failed sync = %+v, want one failure and its error", st)
	}
	if again := p.Service("default/web").Committed[key("web", "http").String()]; !again.Equal(first) {
		t.Errorf("a failed sync moved the commit time from %v to %v", first, again)
	}
	if err := p.Sync(context.Background(), false); err != nil {
		t.Fatal(err)
	}
	if st := p.SyncStatus(); st.Failures != 0 || st.Error != "" {
		t.Errorf("SyncStatus after the retry = %+v, want no failures", st)
	}
	if later := p.Service("default/web").Committed[key("web", "http").String()]; !later.After(first) {
		t.Errorf("the retry's commit time %v is not after the first %v", later, first)
	}
}
