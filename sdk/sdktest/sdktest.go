// Package sdktest unit-tests a Weir hook plugin natively with go test: it
// runs the plugin's callbacks on an encoded batch through the same path as
// the WebAssembly exports and validates the output as Weir does.
package sdktest

import (
	"bytes"
	"errors"
	"net/netip"
	"strings"

	"github.com/weirproxy/weir/sdk/abi"
	"github.com/weirproxy/weir/sdk/guest"
	"github.com/weirproxy/weir/sdk/plan"
)

// Run encodes services as Weir does (full=true), calls p.Configure with config (JSON; "" = none) and p.Process
// through guest.Configure/guest.Process (same recover/status path as the wasm export), then checks the output
// with abi.Decode, the very validation Weir applies. It returns the services Weir would use, or an error
// naming the status/validation failure and the plugin's stderr.
func Run(p guest.Plugin, config string, node plan.Node, services ...*plan.Service) ([]*plan.Service, error) {
	if config == "" {
		config = "null"
	}
	var stderr bytes.Buffer
	if st := guest.Configure(p, []byte(config), &stderr); st != abi.StatusOK {
		return nil, failure("configure returned status "+st.String(), &stderr)
	}
	var enc abi.Encoder
	in := enc.Encode(node, services, true)
	out, st := guest.Process(p, in, &stderr)
	if st != abi.StatusOK {
		return nil, failure("process returned status "+st.String(), &stderr)
	}
	res, err := abi.Decode(services, out)
	if err != nil {
		return nil, failure("output rejected: "+err.Error(), &stderr)
	}
	return res, nil
}

// failure builds an error from what went wrong and the plugin's stderr.
func failure(what string, stderr *bytes.Buffer) error {
	if s := strings.TrimSpace(stderr.String()); s != "" {
		what += "; plugin stderr: " + s
	}
	return errors.New("sdktest: " + what)
}

// Service returns a TCP ClusterIP service port ns/name:port-name with cluster IP ip, port and the endpoints.
// The port is unnamed (the port name is empty, as for a single-port Service). It panics on a bad ip.
func Service(ns, name, ip string, port uint16, endpoints ...plan.Endpoint) *plan.Service {
	return &plan.Service{
		Key:        plan.Key{Namespace: ns, Name: name, Protocol: plan.TCP},
		ClusterIPs: []netip.Addr{netip.MustParseAddr(ip)},
		Port:       port,
		Endpoints:  endpoints,
	}
}

// Endpoint returns a ready, serving endpoint for cluster traffic with weight 1 on the given node/zone/pod.
// It panics on a bad addr.
func Endpoint(addr string, port uint16, node, zone, pod string) plan.Endpoint {
	return plan.Endpoint{
		Address: netip.MustParseAddr(addr), Port: port, NodeName: node, Zone: zone, Pod: pod,
		Ready: true, Serving: true, ForCluster: true, Weight: 1,
	}
}
