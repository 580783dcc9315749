package kubernetes

import (
	"log/slog"

	"k8s.io/klog/v2"
)

// RouteClientLogs sends what client-go logs through klog to log instead of
// klog's own format on stderr: its V(0) lines at info level, V(1) to V(4)
// at debug level (slog levels -1 to -4), nothing more verbose. Each line
// carries component=client-go. The setting is process-wide.
func RouteClientLogs(log *slog.Logger) {
	klog.SetSlogLogger(log.With("component", "client-go"))
}
