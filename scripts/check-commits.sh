#!/usr/bin/env bash
# Checks the commits a branch adds: each subject at most 72 characters,
# and a blank line between subject and body. Commits already on the base
# are not judged (older history has longer subjects).
# Usage: scripts/check-commits.sh [BASE]   (default: the merge base with main)
set -euo pipefail
base=${1:-$(git merge-base HEAD main)}
bad=0
while read -r c; do
	subject=$(git log -1 --format=%s "$c")
	if [ "${#subject}" -gt 72 ]; then
		echo "$(git rev-parse --short "$c"): subject of ${#subject} characters, over 72: $subject"
		bad=1
	fi
	second=$(git log -1 --format=%B "$c" | sed -n 2p)
	if [ -n "$second" ]; then
		echo "$(git rev-parse --short "$c"): no blank line after the subject"
		bad=1
	fi
done < <(git rev-list --no-merges "$base..HEAD")
exit $bad
