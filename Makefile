# gymfleet. Two commands do all the set-up on a fresh machine with Go:
#   make demo   a local fleet, rollouts, a checkpoint, a crash, a restore
#   make test   every test: unit, fuzz (briefly), in-process and process-level

GO        ?= go
BIN       := $(CURDIR)/bin
VERSION   := $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS   := -s -w -X main.version=$(VERSION)
FUZZTIME  ?= 100x
# Packages with goroutines and shared state run under the race detector.
RACE_PKGS := ./pkg/... ./cmd/...
CMDS      := envserver modelserver agentserver resourceserver fakeinference gymctl

.PHONY: all build test test-unit test-fuzz test-e2e soak demo bench bench-scale lint fmt vet clean

all: build

build:
	@mkdir -p $(BIN)
	$(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN)/ $(addprefix ./cmd/,$(CMDS))

test: vet test-unit test-fuzz test-e2e

vet:
	@unformatted=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$unformatted" ]; then echo "gofmt would change:"; echo "$$unformatted"; exit 1; fi
	$(GO) vet ./...

test-unit:
	$(GO) test -race -count=1 -timeout 8m $(RACE_PKGS) ./tests/inprocess/... ./tests/upstream/... ./tests/gymstandin/...

# Every fuzz target runs FUZZTIME (a count of executions) on top of its seed corpus.
test-fuzz:
	@scripts/fuzz.sh $(FUZZTIME)

# The process-level suite builds the binaries itself and kills real processes.
# It runs twice at once, every process on each HTTP stack (lean, nethttp;
# see pkg/httpconf), each pass on its own free ports and directories; each
# pass's output is printed once both are done.
E2E_STACKS := lean nethttp
test-e2e: build
	@logs=$$(mktemp -d); pids=; \
	for s in $(E2E_STACKS); do \
		GYMFLEET_BIN=$(BIN) GYMFLEET_E2E_STACK=$$s $(GO) test -count=1 -timeout 10m ./tests/e2e/... >$$logs/$$s.log 2>&1 & pids="$$pids $$!"; \
	done; \
	rc=0; for p in $$pids; do wait $$p || rc=1; done; \
	for s in $(E2E_STACKS); do echo "--- e2e on the $$s HTTP stack"; cat $$logs/$$s.log; done; \
	rm -rf $$logs; exit $$rc

# The random-sequence suite (tests/e2e/sequence_test.go) on fresh seeds for
# SOAK (a duration), each seed SOAK_STEPS operations on a real fleet. A
# failing seed prints the line that reproduces it; SOAK_SHRINK=1 also
# looks for a shorter failing operation list.
SOAK       ?= 10m
SOAK_STEPS ?= 60
soak: build
	GYMFLEET_BIN=$(BIN) GYMFLEET_SEQ_DURATION=$(SOAK) GYMFLEET_SEQ_STEPS=$(SOAK_STEPS) GYMFLEET_SEQ_SHRINK=$(SOAK_SHRINK) \
		$(GO) test -count=1 -timeout 0 -run '^TestSequences$$' -v ./tests/e2e/

demo: build
	$(BIN)/gymctl demo

bench:
	$(GO) test -run '^$$' -bench . -benchmem -count 5 -timeout 20m ./pkg/... | tee bench.out

N ?= 1000
# Both HTTP stacks, one run after the other, then side by side (STACKS=lean
# for one run).
STACKS ?= lean,nethttp
bench-scale: build
	$(BIN)/gymctl bench-scale --rollouts $(N) --stacks $(STACKS) --json bench-scale-$(N).json

lint: vet
	$(GO) run honnef.co/go/tools/cmd/staticcheck@v0.8.2 ./...

fmt:
	gofmt -w $$(git ls-files '*.go')

clean:
	rm -rf $(BIN) .gymfleet bench.out bench-scale-*.json
