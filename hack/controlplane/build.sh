#!/bin/sh
# Builds the test control plane of Weir's end-to-end tests -- kube-apiserver,
# kube-controller-manager and etcd -- and kube-proxy, the reference Weir is
# compared with, from the Go module proxy, once, into a cache folder keyed by
# their versions, and prints that folder. Later runs find the folder complete
# and only print it; a folder from before a program was added gets only the
# missing program built into it.
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

# Each program and the package it is built from.
programs="kube-apiserver kube-controller-manager kube-proxy etcd"
package() {
	case $1 in
	etcd) echo ./etcd ;;
	*) echo "k8s.io/kubernetes/cmd/$1" ;;
	esac
}

# missing prints the programs the folder lacks (all of them when the folder
# was never completed).
missing() {
	for p in $programs; do
		if [ ! -f "$dir/.complete" ] || [ ! -x "$dir/$p" ]; then echo "$p"; fi
	done
}

if [ -z "$(missing)" ]; then
	echo "$dir"
	exit 0
fi

# One build at a time: a second run (CI starts one in the background, make
# e2e another) waits for the first, then finds the folder complete.
mkdir -p "$root"
exec 9>"$root/.lock"
flock 9
todo=$(missing)
if [ -z "$todo" ]; then
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
pkgs=""
for p in $todo; do pkgs="$pkgs $(package "$p")"; done
start=$(date +%s)
echo "building" $todo "($k8s, etcd $etcd) into $dir" >&2
# shellcheck disable=SC2086 # pkgs is a list of words
CGO_ENABLED=0 $GO build -trimpath -ldflags "$ldflags" -o "$tmp/" $pkgs
echo "built in $(($(date +%s) - start)) s" >&2

if [ -f "$dir/.complete" ]; then
	# A folder from before a program was added: move the new ones in.
	for p in $todo; do mv "$tmp/$p" "$dir/$p"; done
else
	touch "$tmp/.complete"
	rm -rf "$dir"
	mv "$tmp" "$dir"
fi
trap - EXIT
rm -rf "$tmp"
echo "$dir"
