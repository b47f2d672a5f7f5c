#!/usr/bin/env bash
# Runs every Go fuzz target of the module briefly (make test): a number of
# executions each, not a duration. go1.26's fuzz coordinator can report a
# spurious "context deadline exceeded" failure when a duration runs out while
# a worker is mid-input on a loaded machine (golang/go#75804, fixed in 1.27);
# an execution count has no deadline to race.
set -euo pipefail
fuzztime=${1:-100x}
cd "$(dirname "$0")/.."
status=0
for pkg in $(go list ./pkg/... ./cmd/...); do
	targets=$(go test -list '^Fuzz' "$pkg" 2>/dev/null | grep '^Fuzz' || true)
	for t in $targets; do
		echo "fuzz $pkg $t ($fuzztime)"
		if ! go test -run '^$' -fuzz "^${t}\$" -fuzztime "$fuzztime" "$pkg" >/tmp/gymfleet-fuzz.log 2>&1; then
			cat /tmp/gymfleet-fuzz.log
			status=1
		fi
	done
done
exit $status
