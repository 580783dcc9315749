// Package sdktest unit-tests a Weir hook plugin natively with go test: it
// runs the plugin's callbacks on an encoded batch through the same path as
// the WebAssembly exports and validates the output as Weir does.
package sdktest

import (
	"errors"
	"io"
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
//
// Like Weir's planner, Run first sets each endpoint's Local and ForLocal flags from node, in place (see
// Locate). Use Capture to assert what the plugin wrote to stderr.
func Run(p guest.Plugin, config string, node plan.Node, services ...*plan.Service) ([]*plan.Service, error) {
	out, _, err := Capture(p, config, node, services...)
	return out, err
}

// Capture is Run that also returns the lines the plugin wrote to stderr, in order: its own writes to
// os.Stderr and the SDK's reasons for a failure (a recovered panic names its file and line), as Weir
// would log them under the plugin's name. While it runs, os.Stderr is a pipe it reads; concurrent
// Captures and Runs take turns.
func Capture(p guest.Plugin, config string, node plan.Node, services ...*plan.Service) (
	out []*plan.Service, stderr []string, err error) {
	return capture(p, config, node, nil, services)
}

// RunSignals is Run with a version 2 batch carrying live signals, as Weir
// sends to a plugin configured with signals: each endpoint gets the
// signals of its address and port in signals (zero when absent).
func RunSignals(p guest.Plugin, config string, node plan.Node, signals map[netip.AddrPort]abi.Signals,
	services ...*plan.Service) ([]*plan.Service, error) {
	if signals == nil {
		signals = map[netip.AddrPort]abi.Signals{}
	}
	out, _, err := capture(p, config, node, signals, services)
	return out, err
}

// capture is Capture, with a version 2 batch when signals is not nil.
func capture(p guest.Plugin, config string, node plan.Node, signals map[netip.AddrPort]abi.Signals,
	services []*plan.Service) (out []*plan.Service, stderr []string, err error) {
	if config == "" {
		config = "null"
	}
	Locate(node, services...)
	var enc abi.Encoder
	version, in := abi.Version1, []byte(nil)
	if signals != nil {
		version, in = abi.Version2, enc.EncodeSignals(node, services, true, signalsOf(services, signals))
	} else {
		in = enc.Encode(node, services, true)
	}
	lines, err := captureStderr(func(w io.Writer) error {
		if st := guest.Configure(p, []byte(config), w); st != abi.StatusOK {
			return errors.New("configure returned status " + st.String())
		}
		res, st := guest.Process(p, in, w)
		if st != abi.StatusOK {
			return errors.New("process returned status " + st.String())
		}
		if out, err = abi.DecodeVersion(version, services, res); err != nil {
			return errors.New("output rejected: " + err.Error())
		}
		return nil
	})
	if err != nil {
		return nil, lines, failure(err.Error(), lines)
	}
	return out, lines, nil
}

// signalsOf lays out the signals of each service's endpoints as the encoder wants them.
func signalsOf(services []*plan.Service, by map[netip.AddrPort]abi.Signals) [][]abi.Signals {
	out := make([][]abi.Signals, len(services))
	for i, s := range services {
		out[i] = make([]abi.Signals, len(s.Endpoints))
		for j, e := range s.Endpoints {
			out[i][j] = by[netip.AddrPortFrom(e.Address, e.Port)]
		}
	}
	return out
}

// failure builds an error from what went wrong and the plugin's stderr.
func failure(what string, stderr []string) error {
	if len(stderr) > 0 {
		what += "; plugin stderr: " + strings.Join(stderr, "\n")
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
