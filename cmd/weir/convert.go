package main

import (
	"errors"
	"fmt"
	"io"

	"github.com/weirproxy/weir/core/config"
)

// runConfigCommand runs weir config convert FILE: it prints the Weir
// configuration equivalent to a KubeProxyConfiguration file (kube-proxy's
// --config, the config.conf of kubeadm's kube-proxy ConfigMap), and the
// fields Weir ignores as comments on stderr. A field Weir does not
// implement is an error naming it, exit 2, as weir run --config FILE
// would refuse it.
func runConfigCommand(args []string, stdout, stderr io.Writer) error {
	if len(args) != 2 || args[0] != "convert" {
		return fmt.Errorf("%w: use weir config convert FILE", errUsage)
	}
	text, warnings, err := config.ConvertKubeProxy(args[1])
	for _, w := range warnings {
		fmt.Fprintf(stderr, "# KubeProxyConfiguration field %s\n", w)
	}
	var cerr *config.Error
	if errors.As(err, &cerr) {
		return fmt.Errorf("%w: %w", errUsage, err)
	}
	if err != nil {
		return err
	}
	_, err = stdout.Write(text)
	return err
}
