#!/usr/bin/env bash
# Runs every fuzz target of the module for FUZZTIME each (default 30s).
#
#   scripts/fuzz.sh [PKG...]        PKG: ./internal/rpc etc. (default: every
#                                   package of the module with a Fuzz target)
#   FUZZTIME=3s scripts/fuzz.sh     how long each target fuzzes
#
# Targets are found in the source (a `func FuzzXxx(` in a _test.go file) and
# confirmed by the test binary's own list, so a new target runs without
# being named anywhere. Each package's test binary is built once, with the
# fuzzing instrumentation, and runs each of its targets in turn in the
# package's directory (where testdata/fuzz/FuzzXxx is its committed
# corpus); what the fuzzer finds interesting goes to the cache `go test
# -fuzz` uses ($GOCACHE/fuzz), so runs build on each other. A target that
# fails leaves its input in testdata/fuzz/FuzzXxx/ (commit it with the fix:
# it is a regression test from then on) and makes the script fail after
# every target has run.
set -euo pipefail
cd "$(dirname "$0")/.."
FUZZTIME=${FUZZTIME:-30s}
cache=$(go env GOCACHE)/fuzz
bindir=$(mktemp -d)
trap 'rm -rf "$bindir"' EXIT

if [ $# -eq 0 ]; then
	mapfile -t dirs < <(go list -f '{{.Dir}}' ./... | while read -r d; do
		grep -lq '^func Fuzz[A-Z0-9_a-z]*(' "$d"/*_test.go 2>/dev/null && echo "$d" || true
	done)
else
	mapfile -t dirs < <(go list -f '{{.Dir}}' "$@")
fi

failed=()
start=$SECONDS
for dir in "${dirs[@]}"; do
	pkg=$(go list -f '{{.ImportPath}}' "$dir")
	bin=$bindir/${pkg//\//_}.test
	go test -c -fuzz . -o "$bin" "$dir"
	for target in $(cd "$dir" && "$bin" -test.list '^Fuzz'); do
		echo "== $pkg $target ($FUZZTIME)"
		if ! (cd "$dir" && "$bin" -test.run '^$' -test.fuzz "^$target\$" -test.fuzztime "$FUZZTIME" \
			-test.fuzzminimizetime 50x -test.fuzzcachedir "$cache/$pkg"); then
			failed+=("$pkg $target")
		fi
	done
done
echo "fuzzing took $((SECONDS - start)) s"
if [ ${#failed[@]} -gt 0 ]; then
	printf 'FAIL: %s\n' "${failed[@]}"
	exit 1
fi
