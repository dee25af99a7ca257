#!/bin/sh
# Builds the S3 server the workspace tests run against (SeaweedFS's weed,
# from the Go module proxy at a pinned version) into a cache directory,
# once per version, and prints the binary's path. Later runs print the
# cached path at once. The module's go.mod has replace directives, so it
# is built inside a copy of its own source rather than with go install.
set -eu
VERSION=v0.0.0-20261109003541-7506e5f91cd6
CACHE=${WARREN_TEST_CACHE:-${HOME:-/root}/.cache/warren-test}
BIN=$CACHE/weed-$VERSION
if [ -x "$BIN" ]; then
	echo "$BIN"
	exit 0
fi
mkdir -p "$CACHE"
exec 9>"$CACHE/weed.lock"
flock 9 # one build at a time; a waiter finds the binary made
if [ -x "$BIN" ]; then
	echo "$BIN"
	exit 0
fi
echo "s3-server: building SeaweedFS $VERSION into $CACHE (once; ~10-30 minutes on 2 cores)" >&2
WORK=$(mktemp -d "$CACHE/build.XXXXXX")
trap 'chmod -R u+w "$WORK" 2>/dev/null; rm -rf "$WORK"' EXIT
cd "$WORK"
echo "s3-server: downloading the module" >&2
DIR=$(GOFLAGS=-mod=mod timeout 20m go mod download -json "github.com/seaweedfs/seaweedfs@$VERSION" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
[ -n "$DIR" ] || { echo "s3-server: module download failed" >&2; exit 1; }
cp -r "$DIR" src
chmod -R u+w src
echo "s3-server: compiling weed" >&2
(cd src && GOFLAGS=-buildvcs=false timeout 60m go build -trimpath -o "$BIN.tmp" ./weed)
mv "$BIN.tmp" "$BIN"
echo "s3-server: built $BIN" >&2
echo "$BIN"
