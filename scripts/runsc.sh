#!/bin/sh
# Builds gVisor's runsc (the gvisor isolation tier's runtime) from the Go
# module proxy at a pinned version into a cache directory, once per
# version, and prints the binary's path. Later runs print the cached path
# at once. Debian's runsc is too old (no systrap platform); the build is
# static (cgo off: a cgo build fails inside runsc's own sandbox).
# With --cached it builds nothing: it prints the path if the binary is
# there and fails otherwise (what tests use).
set -eu
VERSION=v0.0.0-20260905035102-160fafc42237
CACHE=${WARREN_TEST_CACHE:-${HOME:-/root}/.cache/warren-test}
BIN=$CACHE/runsc-$VERSION
if [ -x "$BIN" ]; then
	echo "$BIN"
	exit 0
fi
if [ "${1:-}" = --cached ]; then
	echo "runsc: $BIN is not built (scripts/runsc.sh builds it)" >&2
	exit 1
fi
mkdir -p "$CACHE"
exec 9>"$CACHE/runsc.lock"
flock 9 # one build at a time; a waiter finds the binary made
if [ -x "$BIN" ]; then
	echo "$BIN"
	exit 0
fi
echo "runsc: building gVisor $VERSION into $CACHE (once; ~20 minutes on 2 busy cores)" >&2
WORK=$(mktemp -d "$CACHE/runsc-build.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
GOBIN=$WORK CGO_ENABLED=0 GOFLAGS=-buildvcs=false timeout 60m \
	go install -trimpath -ldflags='-s -w' "gvisor.dev/gvisor/runsc@$VERSION"
mv "$WORK/runsc" "$BIN"
echo "runsc: built $BIN" >&2
echo "$BIN"
