#!/usr/bin/env bash
# Runs every Go fuzz target of the module briefly (make test): a number of
# executions each, not a duration. go1.26's fuzz coordinator can report a
# spurious "context deadline exceeded" failure when a duration runs out while
# a worker is mid-input on a loaded machine (golang/go#75804, fixed in 1.27);
# an execution count has no deadline to race.
#
# The targets are read from each package's test files as `go list` selects
# them for this platform (build constraints applied), not with
# `go test -list`, which compiles and links every package's test binary
# only to list it. A `func Fuzz` line of another form than
# `func FuzzX(f *testing.F)` stops the script rather than going unrun.
set -euo pipefail
fuzztime=${1:-100x}
cd "$(dirname "$0")/.."
cache="$(go env GOCACHE)/fuzz"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
status=0
while read -r pkg dir files; do
	[ -n "$files" ] || continue
	# shellcheck disable=SC2086 # files is a list of paths without spaces
	declared=$(grep -h '^func Fuzz' $files || true)
	# shellcheck disable=SC2086
	targets=$(grep -hoE '^func Fuzz[A-Za-z0-9_]*\([A-Za-z0-9_]+ \*testing\.F\)' $files | sed -E 's/^func (Fuzz[A-Za-z0-9_]*)\(.*/\1/' || true)
	if [ "$(printf '%s' "$declared" | grep -c .)" != "$(printf '%s' "$targets" | grep -c .)" ]; then
		echo "fuzz: $pkg declares a fuzz target this script cannot read:"
		echo "$declared"
		exit 1
	fi
	[ -n "$targets" ] || continue
	# One instrumented test binary per package, run once per target: go test
	# -fuzz would link the package again for every target. The binary runs
	# in the package's directory (its testdata/fuzz seed corpus) with the
	# cache directory go test itself would give it.
	bin="$work/$(basename "$pkg").fuzz.test"
	if ! go test -c -fuzz . -o "$bin" "$pkg" >"$work/log" 2>&1; then
		cat "$work/log"
		status=1
		continue
	fi
	for t in $targets; do
		echo "fuzz $pkg $t ($fuzztime)"
		if ! (cd "$dir" && "$bin" -test.run '^$' -test.fuzz "^${t}\$" -test.fuzztime "$fuzztime" \
			-test.fuzzcachedir "$cache/$pkg" -test.timeout 10m -test.paniconexit0) >"$work/log" 2>&1; then
			cat "$work/log"
			status=1
		fi
	done
done < <(go list -f '{{.ImportPath}} {{.Dir}}{{range .TestGoFiles}} {{$.Dir}}/{{.}}{{end}}{{range .XTestGoFiles}} {{$.Dir}}/{{.}}{{end}}' ./pkg/... ./cmd/...)
exit $status
