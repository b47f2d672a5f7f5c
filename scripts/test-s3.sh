#!/usr/bin/env bash
# The object-store integration target (make test-s3): starts a SeaweedFS
# S3 server on this machine (scripts/seaweedfs.sh, built once and cached),
# then runs against it the checkpoint store's conformance suite (its
# s3server backend) and the process-level S3 scenarios of tests/e2e, and
# stops the server whatever happens.
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
BIN=${GYMFLEET_BIN:-$PWD/bin}

scripts/seaweedfs.sh build >/dev/null
dir=$(mktemp -d)
cleanup() {
	scripts/seaweedfs.sh stop "$dir"
	rm -rf "$dir"
}
trap cleanup EXIT
scripts/seaweedfs.sh start "$dir"
# shellcheck disable=SC1091
. "$dir/env"

echo "--- checkpoint store conformance suite against $GYMFLEET_S3_ENDPOINT"
"$GO" test -race -count=1 -timeout 10m ./pkg/checkpoint/ckptstore/
echo "--- process-level S3 scenarios"
GYMFLEET_BIN=$BIN "$GO" test -count=1 -timeout 10m -v -run '^TestS3_' ./tests/e2e/ |
	grep -E '^(=== RUN|--- |PASS|FAIL|ok)|s3_test.go' | tee "$dir/e2e.out"
# A skipped scenario would mean the server was not reached: fail instead.
if grep -q -- '--- SKIP' "$dir/e2e.out" || ! grep -q '^ok' "$dir/e2e.out"; then
	echo "test-s3: the S3 scenarios did not all run and pass" >&2
	exit 1
fi
