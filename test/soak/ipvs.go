package soak

import (
	"context"
	"fmt"
	"time"

	"github.com/moby/ipvs"
	"github.com/vishvananda/netlink"
	vnetns "github.com/vishvananda/netns"
)

// The IPVS backend's objects the faults remove (backends/ipvs).
const (
	ipvsInterface = "weir-ipvs0"
	ipvsSet       = "WEIR-IPVS-CLUSTER-IP"
)

func ipvsMode(s *run) bool { return s.cfg.backendMode() == "ipvs" }

// ipvsHandle opens IPVS in the node namespace.
func (s *run) ipvsHandle() (*ipvs.Handle, error) {
	return ipvs.New(fmt.Sprintf("/proc/self/fd/%d", s.c.topo.Node.Fd()))
}

// flushIPVS removes every virtual server, as ipvsadm -C does.
func flushIPVS(ctx context.Context, s *run) (injected, error) {
	h, err := s.ipvsHandle()
	if err != nil {
		return injected{}, err
	}
	defer h.Close()
	if err := h.Flush(); err != nil {
		return injected{}, fmt.Errorf("ipvsadm -C: %w", err)
	}
	return injected{at: time.Now(), note: "every virtual server deleted (ipvsadm -C)"}, nil
}

// deleteVirtualServer removes one virtual server.
func deleteVirtualServer(ctx context.Context, s *run) (injected, error) {
	h, err := s.ipvsHandle()
	if err != nil {
		return injected{}, err
	}
	defer h.Close()
	svcs, err := h.GetServices()
	if err != nil {
		return injected{}, err
	}
	if len(svcs) == 0 {
		return injected{}, fmt.Errorf("no virtual server to delete")
	}
	v := svcs[s.faultRNG.IntN(len(svcs))]
	if err := h.DelService(v); err != nil {
		return injected{}, fmt.Errorf("delete virtual server %s:%d: %w", v.Address, v.Port, err)
	}
	return injected{at: time.Now(), note: fmt.Sprintf("virtual server %s:%d deleted", v.Address, v.Port)}, nil
}

// deleteIPVSInterface removes the dummy interface holding the service IPs.
func deleteIPVSInterface(ctx context.Context, s *run) (injected, error) {
	h, err := netlink.NewHandleAt(vnetns.NsHandle(s.c.topo.Node.Fd()))
	if err != nil {
		return injected{}, err
	}
	defer h.Close()
	l, err := h.LinkByName(ipvsInterface)
	if err != nil {
		return injected{}, err
	}
	if err := h.LinkDel(l); err != nil {
		return injected{}, err
	}
	return injected{at: time.Now(), note: "interface " + ipvsInterface + " deleted"}, nil
}

// flushIPVSSet empties the set the masquerade rules match cluster IPs in.
func flushIPVSSet(ctx context.Context, s *run) (injected, error) {
	h, err := netlink.NewHandleAt(vnetns.NsHandle(s.c.topo.Node.Fd()))
	if err != nil {
		return injected{}, err
	}
	defer h.Close()
	if err := h.IpsetFlush(ipvsSet); err != nil {
		return injected{}, fmt.Errorf("ipset flush %s: %w", ipvsSet, err)
	}
	return injected{at: time.Now(), note: "ipset " + ipvsSet + " flushed"}, nil
}
