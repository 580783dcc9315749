# Weir's build, test, demo and benchmark entry points.
GO        ?= go
BIN       := bin
VERSION   ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS   := -X main.version=$(VERSION)
PKGS      := ./...

# Example hook plugins: Go ones build with the Go toolchain; local-boost is
# Rust, built with Debian's rustc and its wasm32-wasi standard library
# (packages rustc, libstd-rust-dev-wasm32 and lld-14).
GO_PLUGINS := canary zone-preference drain affinity
RUSTC      ?= /usr/bin/rustc

.PHONY: all build plugins test test-unit test-kernel demo bench lint clean

all: build

## build: the weir binary in bin/
build:
	CGO_ENABLED=0 $(GO) build -ldflags "$(LDFLAGS)" -o $(BIN)/weir ./cmd/weir

## plugins: the example hook plugins, to bin/plugins/*.wasm
plugins: $(GO_PLUGINS:%=$(BIN)/plugins/%.wasm) $(BIN)/plugins/local-boost.wasm

# go build decides itself whether anything changed.
$(BIN)/plugins/%.wasm: FORCE
	GOOS=wasip1 GOARCH=wasm $(GO) build -buildmode=c-shared -o $@ ./plugins/$*

$(BIN)/plugins/local-boost.wasm: plugins/local-boost/src/lib.rs
	@mkdir -p $(BIN)/plugins
	$(RUSTC) --edition 2021 --target wasm32-wasi --crate-type cdylib -C opt-level=s -C lto \
	  -C strip=symbols -C linker=/usr/bin/rust-lld -o $@ $<

FORCE:

## test: lint, then every test of both modules (kernel tests need root; under CI=true they never skip)
test: lint plugins
	$(GO) test -count=1 -race $(PKGS)
	cd sdk && $(GO) test -count=1 -race ./...

## demo: as root, a three-pod "cluster" in network namespaces served by weir run
demo: build
	$(GO) run ./hack/demo --weir $(BIN)/weir --manifests examples/demo

## bench: scale benchmarks (1k and 10k services x 10 endpoints); figures go to docs/performance.md
bench: build plugins
	$(GO) test -run '^$$' -bench . -benchmem -benchtime 3x ./backends/nftables/
	$(GO) test -run '^$$' -bench 'Load|Reload|Decode' -benchtime 10x ./core/source/files/
	cd sdk && $(GO) test -run '^$$' -bench . -benchmem -benchtime 10x ./abi/
	$(GO) test -run '^$$' -bench . -benchtime 5x ./hooks/
	$(GO) test -run '^$$' -bench 'Sync10k' -benchmem -benchtime 3x -timeout 60m ./backends/iptables/
	$(GO) run ./hack/bench --weir $(BIN)/weir --services 1000,10000 --plugins $(BIN)/plugins --iptables legacy,nft

## lint: gofmt and go vet on both modules
lint:
	@out=$$(gofmt -l .); \
	  if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)
	cd sdk && $(GO) vet ./...

clean:
	rm -rf $(BIN)
