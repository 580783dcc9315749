package main

import (
	"fmt"
	"time"

	k8s "k8s.io/client-go/kubernetes"

	"github.com/weirproxy/weir/core/events"
	"github.com/weirproxy/weir/core/metrics"
	"github.com/weirproxy/weir/core/source/kubernetes"
	"github.com/weirproxy/weir/hooks"
)

// nodeEvents starts the reporter of Events on this node's Node when the
// source is a cluster; nil (and a no-op stop) otherwise.
func nodeEvents(env *environment) (*events.Reporter, func(), error) {
	if env.cfg.Source.Kind != "kubernetes" {
		return nil, func() {}, nil
	}
	rc, err := kubernetes.Config(env.cfg.Source.Kubeconfig)
	if err != nil {
		return nil, nil, err
	}
	client, err := k8s.NewForConfig(rc)
	if err != nil {
		return nil, nil, fmt.Errorf("events: %w", err)
	}
	r, stop := events.Start(client, env.cfg.NodeName)
	return r, stop, nil
}

// observed is what the proxy and the hook chain report to: the metrics,
// and the Node's events when there is a reporter.
type observed struct {
	*metrics.Metrics
	ev *events.Reporter
	// debug remembers plugin outcomes for the debug endpoint; nil in
	// commands that serve none.
	debug *debugServer
}

// observed also counts failed pulls of oci:// plugins.
var _ hooks.RegistryObserver = observed{}

// PluginCalled records the call in the metrics and the debug endpoint.
func (o observed) PluginCalled(plugin string, took time.Duration, err error) {
	o.Metrics.PluginCalled(plugin, took, err)
	if o.debug != nil {
		o.debug.pluginCalled(plugin, err)
	}
}

// CommitFailed counts the failure in both.
func (o observed) CommitFailed() {
	o.Metrics.CommitFailed()
	if o.ev != nil {
		o.ev.CommitFailed()
	}
}

// Synced records the sync and ends any run of failures.
func (o observed) Synced(full bool, took time.Duration, end time.Time) {
	o.Metrics.Synced(full, took, end)
	if o.ev != nil {
		o.ev.Committed()
	}
}

// PluginQuarantined records the quarantine in both.
func (o observed) PluginQuarantined(plugin string, quarantined bool) {
	o.Metrics.PluginQuarantined(plugin, quarantined)
	if o.debug != nil {
		o.debug.pluginQuarantined(plugin, quarantined)
	}
	if o.ev != nil {
		o.ev.PluginQuarantined(plugin, quarantined)
	}
}
