#!/usr/bin/env bash
# Builds the fleet's binaries of a commit, once, and prints their directory.
# The commit's tree is laid out in a temporary directory (git archive: no
# worktree is registered in the shared repository), built there with this
# machine's Go, and removed; the binaries are kept in
# ~/.cache/gymfleet/bench-compare/<commit>/bin for the next comparison.
# Usage: scripts/build-ref.sh REF
set -euo pipefail
ref=${1:?usage: scripts/build-ref.sh REF}
hash=$(git rev-parse --verify --quiet "$ref^{commit}") || { echo "build-ref: $ref is not a commit" >&2; exit 1; }
short=$(git rev-parse --short "$hash")
out=${XDG_CACHE_HOME:-$HOME/.cache}/gymfleet/bench-compare/$hash/bin
if [ -x "$out/gymctl" ]; then
	echo "$out"
	exit 0
fi
tmp=$(mktemp -d "${TMPDIR:-/tmp}/gymfleet-ref-$short.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
git archive --format=tar "$hash" | tar -x -C "$tmp"
cmds=()
for c in envserver modelserver agentserver resourceserver fakeinference gymctl; do
	[ -d "$tmp/cmd/$c" ] && cmds+=("./cmd/$c")
done
echo "build-ref: building $short (${cmds[*]})" >&2
mkdir -p "$tmp/bin"
(cd "$tmp" && go build -trimpath -ldflags "-s -w -X main.version=$short" -o "$tmp/bin/" "${cmds[@]}")
mkdir -p "$(dirname "$out")"
rm -rf "$out.tmp" && mv "$tmp/bin" "$out.tmp" && mv "$out.tmp" "$out"
echo "$out"
