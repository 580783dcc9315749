#!/bin/sh
# Builds the test control plane of Weir's end-to-end tests -- kube-apiserver,
# kube-controller-manager and etcd -- from the Go module proxy, once, into a
# cache folder keyed by their versions, and prints that folder. Later runs
# find the folder complete and only print it.
#
#   WEIRTEST_CONTROLPLANE_CACHE  the cache root (default ~/.cache/weir-controlplane)
#   GO                       the go command (default go)
#
# A cold build takes tens of minutes on two cores; progress goes to stderr.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
GO=${GO:-go}
cd "$here"

k8s=$($GO list -m -f '{{.Version}}' k8s.io/kubernetes)
etcd=$($GO list -m -f '{{.Version}}' go.etcd.io/etcd/server/v3)
root=${WEIRTEST_CONTROLPLANE_CACHE:-${HOME:?}/.cache/weir-controlplane}
dir="$root/k8s-$k8s-etcd-$etcd"

if [ -f "$dir/.complete" ]; then
	echo "$dir"
	exit 0
fi

# One build at a time: a second run (CI starts one in the background, make
# e2e another) waits for the first, then finds the folder complete.
mkdir -p "$root"
exec 9>"$root/.lock"
flock 9
if [ -f "$dir/.complete" ]; then
	echo "$dir"
	exit 0
fi

# The version the binaries report, as Kubernetes' own release build stamps it.
major=$(echo "$k8s" | sed 's/^v\([0-9]*\)\..*/\1/')
minor=$(echo "$k8s" | sed 's/^v[0-9]*\.\([0-9]*\)\..*/\1/')
ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
	ldflags="$ldflags -X $pkg.gitVersion=$k8s -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
	ldflags="$ldflags -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done

tmp=$(mktemp -d "$root/.build.XXXXXX")
chmod 755 "$tmp"
trap 'rm -rf "$tmp"' EXIT
start=$(date +%s)
echo "building kube-apiserver and kube-controller-manager $k8s, etcd $etcd into $dir" >&2
CGO_ENABLED=0 $GO build -trimpath -ldflags "$ldflags" -o "$tmp/" \
	k8s.io/kubernetes/cmd/kube-apiserver \
	k8s.io/kubernetes/cmd/kube-controller-manager \
	./etcd
echo "built in $(($(date +%s) - start)) s" >&2

touch "$tmp/.complete"
rm -rf "$dir"
mv "$tmp" "$dir"
trap - EXIT
echo "$dir"
