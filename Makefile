# sandboxflow — a newcomer needs two commands:
#   make run    boot the embedded stack and run one command in a sandbox
#   make test   vet and test everything (what CI runs)

GO  ?= go
CMD ?= sh -c 'echo hello from a sandbox; uname -a'
# ARGS: flags for devserver run and the starter, e.g. ARGS="--then 'cat f'"
ARGS ?=
RUNS ?= 500
FAULT_RATE ?= 0.2

# debian_package TARGET,COMMAND,PACKAGE: install Debian's PACKAGE unless
# COMMAND is on PATH; as root only, else say what to run and fail.
define debian_package
if ! command -v $(2) >/dev/null; then \
	if [ "$$(id -u)" -ne 0 ]; then \
		echo "$(1): $(2) is missing; install it as root (sudo apt-get update && sudo apt-get install -y $(3)), then run make $(1) again" >&2; \
		exit 1; \
	fi; \
	echo "$(1): installing Debian's $(3) package"; \
	apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y $(3); \
fi
endef

# The program every lease's init and managed process runs (localsandbox/cmd/sandboxflow-init):
# a server finds it beside its binary; programs run with go run or go test are
# told where it is. Without it a server re-executes its own, far larger binary.
export SANDBOXD_INIT_PROGRAM = $(CURDIR)/bin/sandboxflow-init

.PHONY: run dev unit test test-root test-localsandbox test-other-platforms test-devserver fleet-test vet build bench chaos fleet webui-check generate clean

## run: boot Temporal + Web UI + local sandbox + worker, run CMD, print its output and the Web UI link
run: bin/devserver
	bin/devserver run $(ARGS) -- $(CMD)

## dev: the whole stack until Ctrl-C (Temporal :7233, Web UI :8233, sandbox :7575)
dev: bin/devserver
	bin/devserver dev

# go build is incremental and fast when nothing changed; make only orders it.
.PHONY: bin/devserver bin/sandboxflow-init
bin/devserver: bin/sandboxflow-init
	cd devserver && $(GO) build -o ../bin/devserver .

bin/sandboxflow-init:
	cd localsandbox && $(GO) build -o ../bin/ ./cmd/sandboxflow-init

## unit: the core packages in under a minute: no root, no Temporal server, no sandbox server
unit:
	$(GO) test -count=1 ./sandbox/... ./createos/... ./activities/... ./workflows/... ./codec/... ./metrics/... ./faultproxy/... ./sandboxtest/... ./sandboxclient/... ./internal/... ./docs/

## test: vet and race-test the three modules (the library, the sandbox server, then the devserver module with the e2e tests and the reliability matrix), the fleet test, and the library's build for macOS and Windows
test: test-root test-localsandbox test-devserver test-other-platforms

test-root:
	$(GO) vet ./...
	$(GO) test -race ./...

# The server's tests run leases from their own binary, as a server without
# the init program does (TestLeasesRunTheInitProgram covers the program).
test-localsandbox:
	cd localsandbox && $(GO) vet ./...
	cd localsandbox && SANDBOXD_INIT_PROGRAM= $(GO) test -race -timeout 20m ./...

# The library is for every platform a Temporal worker runs on; the server is Linux only.
test-other-platforms:
	GOOS=darwin $(GO) vet ./...
	GOOS=windows $(GO) vet ./...

test-devserver: bin/sandboxflow-init
	cd devserver && $(GO) vet ./...
	cd devserver && $(GO) test -race -timeout 20m ./...
	$(MAKE) fleet-test

## fleet-test: three sandbox hosts on one Temporal server, one lost mid-run; part of test (65 s on 2 cores; without the race detector, under which it takes 6 min: see devserver/reliability/fleet_test.go)
fleet-test: bin/sandboxflow-init
	cd devserver && $(GO) test -count=1 -timeout 10m -run TestAFleet ./reliability/

vet:
	$(GO) vet ./...
	cd localsandbox && $(GO) vet ./...
	cd devserver && $(GO) vet ./...

## build: every binary into ./bin
build:
	$(GO) build -o bin/ ./cmd/worker ./cmd/starter
	cd localsandbox && $(GO) build -o ../bin/ ./cmd/sandboxd ./cmd/sandboxflow-init
	cd devserver && $(GO) build -o ../bin/devserver .

## bench: latency, throughput, streaming, recovery, live-output latency, the lease machine and its network against their floors (installs bubblewrap and slirp4netns if missing; not part of test)
bench: bin/sandboxflow-init
	@$(call debian_package,bench,bwrap,bubblewrap)
	@$(call debian_package,bench,slirp4netns,slirp4netns)
	cd devserver && $(GO) run ./cmd/bench

## chaos: a soak of concurrent runs through random faults; fails if anything leaked or was lost
chaos: bin/sandboxflow-init
	cd devserver && $(GO) run ./cmd/chaos -runs $(RUNS) -fault-rate $(FAULT_RATE)

## fleet: three sandboxd + host-mode worker processes on one embedded Temporal server; 60 runs spread over them, then one host SIGKILLed mid-run
fleet: build
	cd devserver && $(GO) run ./cmd/fleet -bin ../bin

## webui-check: in headless Chromium (installed if missing), open a compensated, encrypted run and a running one in the embedded Web UI; check its pages show them decoded, the running command's live output among them; save docs/webui-compensated.png
webui-check: bin/sandboxflow-init
	@$(call debian_package,webui-check,chromium,chromium)
	cd devserver && $(GO) run ./cmd/webuicheck -chromium /usr/bin/chromium -out ../docs/webui-compensated.png

## generate: regenerate the committed mocks and the JSON Schema (docs/schema)
generate:
	$(GO) generate ./...
	cd localsandbox && $(GO) generate ./...

clean:
	rm -rf bin
