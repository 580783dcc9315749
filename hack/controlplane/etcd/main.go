// Command etcd is etcd's server, built from go.etcd.io/etcd/server/v3 at the
// version k8s.io/kubernetes requires, for Weir's test control plane.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
