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
#
# Go's fuzzing coordinator (go1.26) can fail a target with a bare "context
# deadline exceeded" when -fuzztime ends while a worker is mid-input on a
# loaded machine (golang/go#75804): nothing was found and no input is
# written. Such a run is retried once; any other failure, or a second one,
# fails the script.
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

# fuzz_one DIR BIN TARGET LOG: one fuzzing run of TARGET, its output also
# in LOG.
fuzz_one() {
	(cd "$1" && "$2" -test.run '^$' -test.fuzz "^$3\$" -test.fuzztime "$FUZZTIME" \
		-test.fuzzminimizetime 50x -test.fuzzcachedir "$cache/$pkg") 2>&1 | tee "$4"
	return "${PIPESTATUS[0]}"
}

# deadline_race LOG: the run in LOG failed only by the coordinator's race.
deadline_race() {
	grep -q '^    context deadline exceeded$' "$1" &&
		! grep -qE 'Failing input written|panic:|_test\.go:[0-9]+:' "$1"
}

failed=()
start=$SECONDS
for dir in "${dirs[@]}"; do
	pkg=$(go list -f '{{.ImportPath}}' "$dir")
	bin=$bindir/${pkg//\//_}.test
	go test -c -fuzz . -o "$bin" "$dir"
	for target in $(cd "$dir" && "$bin" -test.list '^Fuzz'); do
		echo "== $pkg $target ($FUZZTIME)"
		log=$bindir/$target.log
		if fuzz_one "$dir" "$bin" "$target" "$log"; then
			continue
		fi
		if deadline_race "$log"; then
			echo "== $pkg $target: the fuzzing coordinator's deadline race (nothing found); once more"
			fuzz_one "$dir" "$bin" "$target" "$log" && continue
		fi
		failed+=("$pkg $target")
	done
done
echo "fuzzing took $((SECONDS - start)) s"
if [ ${#failed[@]} -gt 0 ]; then
	printf 'FAIL: %s\n' "${failed[@]}"
	exit 1
fi
