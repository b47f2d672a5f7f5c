#!/usr/bin/env bash
# Runs every Go fuzz target of the module for a short time each (make test).
set -euo pipefail
fuzztime=${1:-2s}
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
