#!/bin/sh
# Builds the real Kubernetes control plane the cluster tests run against
# (kube-apiserver and etcd, from the Go module proxy at pinned versions)
# into a cache directory, once per version, and prints the directory that
# holds both binaries. Later runs print it at once. Each binary is built in
# a throw-away module of its own, so the kubernetes dependency graph never
# enters Warren's go.mod. The apiserver's cold build is long (~30 minutes
# on 2 busy cores, 2.5 GB for the linker), so it runs at the lowest
# priority on one core; see docs/kubernetes.md.
set -eu
KUBE=v1.37.2
ETCD=v3.7.3
CACHE=${WARREN_TEST_CACHE:-${HOME:-/root}/.cache/warren-test}
DIR=$CACHE/kube-$KUBE-etcd-$ETCD
if [ -x "$DIR/kube-apiserver" ] && [ -x "$DIR/etcd" ]; then
	echo "$DIR"
	exit 0
fi
mkdir -p "$CACHE"
exec 9>"$CACHE/kube.lock"
flock 9 # one build at a time; a waiter finds the binaries made
if [ -x "$DIR/kube-apiserver" ] && [ -x "$DIR/etcd" ]; then
	echo "$DIR"
	exit 0
fi
echo "kube: building kube-apiserver $KUBE and etcd $ETCD into $DIR (once; ~30 minutes on 2 busy cores)" >&2
WORK=$(mktemp -d "$CACHE/build.XXXXXX")
trap 'chmod -R u+w "$WORK" 2>/dev/null; rm -rf "$WORK"' EXIT
mkdir -p "$DIR"
export GOFLAGS=-buildvcs=false GOTOOLCHAIN=local GOMAXPROCS=1
build() { # build OUT PKG [LDFLAGS]: a low-priority, one-core build
	nice -n 19 timeout 4h go build -p 1 -trimpath -ldflags="-s -w ${3:-}" -o "$1.tmp" "$2"
	mv "$1.tmp" "$1"
}

# etcd: its server module has package main at its root.
mkdir "$WORK/etcd"
cd "$WORK/etcd"
printf 'module warrenkube/etcd\n\ngo 1.26.0\n\nrequire go.etcd.io/etcd/server/v3 %s\n' "$ETCD" >go.mod
printf '//go:build tools\n\npackage tools\n\nimport _ "go.etcd.io/etcd/server/v3"\n' >tools.go
echo "kube: etcd: resolving modules" >&2
nice -n 19 timeout 20m go mod tidy
echo "kube: etcd: compiling" >&2
build "$DIR/etcd" go.etcd.io/etcd/server/v3

# kube-apiserver: k8s.io/kubernetes requires its staging modules at v0.0.0
# with replaces a dependent module ignores, so each is replaced here by its
# published release of the same minor version.
mkdir "$WORK/apiserver"
cd "$WORK/apiserver"
echo "kube: kube-apiserver: resolving modules" >&2
KDIR=$(GOFLAGS=-mod=mod timeout 20m go mod download -json "k8s.io/kubernetes@$KUBE" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
[ -n "$KDIR" ] || { echo "kube: k8s.io/kubernetes download failed" >&2; exit 1; }
STAGING=v0.${KUBE#v1.}
{
	printf 'module warrenkube/apiserver\n\ngo 1.26.0\n\nrequire k8s.io/kubernetes %s\n\nreplace (\n' "$KUBE"
	# the staging modules kubernetes replaces with ./staging/src/...
	sed -n 's#^[[:space:]]*\(k8s.io/[a-z0-9-]*\) => \./staging/.*#\t\1 => \1 '"$STAGING"'#p' "$KDIR/go.mod" |
		grep -v -e sample-cli-plugin -e sample-controller
	printf ')\n'
} >go.mod
printf '//go:build tools\n\npackage tools\n\nimport _ "k8s.io/kubernetes/cmd/kube-apiserver"\n' >tools.go
nice -n 19 timeout 20m go mod tidy
echo "kube: kube-apiserver: compiling (the long part)" >&2
V=k8s.io/component-base/version
MINOR=${KUBE#v1.}
MINOR=${MINOR%%.*}
build "$DIR/kube-apiserver" k8s.io/kubernetes/cmd/kube-apiserver \
	"-X $V.gitVersion=$KUBE -X $V.gitMajor=1 -X $V.gitMinor=$MINOR -X $V.gitTreeState=clean"
echo "kube: built $DIR" >&2
echo "$DIR"
