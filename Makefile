# sandboxflow — a newcomer needs two commands:
#   make run    boot the embedded stack and run one command in a sandbox
#   make test   vet and test everything (what CI runs)

GO  ?= go
CMD ?= sh -c 'echo hello from a sandbox; uname -a'
# ARGS: flags for devserver run and the starter, e.g. ARGS="--then 'cat f'"
ARGS ?=
RUNS ?= 500
FAULT_RATE ?= 0.2

.PHONY: run dev test test-root test-devserver vet build bench chaos generate clean

## run: boot Temporal + Web UI + local sandbox + worker, run CMD, print its output and the Web UI link
run: bin/devserver
	bin/devserver run $(ARGS) -- $(CMD)

## dev: the whole stack until Ctrl-C (Temporal :7233, Web UI :8233, sandbox :7575)
dev: bin/devserver
	bin/devserver dev

# go build is incremental and fast when nothing changed; make only orders it.
.PHONY: bin/devserver
bin/devserver:
	cd devserver && $(GO) build -o ../bin/devserver .

## test: vet and race-test both modules (the library, then the devserver module with the e2e tests and the reliability matrix)
test: test-root test-devserver

test-root:
	$(GO) vet ./...
	$(GO) test -race ./...

test-devserver:
	cd devserver && $(GO) vet ./...
	cd devserver && $(GO) test -race -timeout 20m ./...

vet:
	$(GO) vet ./...
	cd devserver && $(GO) vet ./...

## build: every binary into ./bin
build:
	$(GO) build -o bin/ ./worker ./starter ./cmd/sandboxd
	cd devserver && $(GO) build -o ../bin/devserver .

## bench: latency, throughput, streaming and recovery against their floors (not part of test)
bench:
	cd devserver && $(GO) run ./cmd/bench

## chaos: a soak of concurrent runs through random faults; fails if anything leaked or was lost
chaos:
	cd devserver && $(GO) run ./cmd/chaos -runs $(RUNS) -fault-rate $(FAULT_RATE)

## generate: regenerate the committed mocks
generate:
	$(GO) generate ./...

clean:
	rm -rf bin
