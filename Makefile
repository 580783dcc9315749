# Weir's build, test, demo and benchmark entry points.
GO        ?= go
BIN       := bin
VERSION   ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS   := -X main.version=$(VERSION)
PKGS      := ./...

.PHONY: all build test test-unit test-kernel demo bench lint clean

all: build

## build: the weir binary in bin/
build:
	CGO_ENABLED=0 $(GO) build -ldflags "$(LDFLAGS)" -o $(BIN)/weir ./cmd/weir

## test: lint, then every test of both modules (kernel tests need root; under CI=true they never skip)
test: lint
	$(GO) test -count=1 -race $(PKGS)
	cd sdk && $(GO) test -count=1 -race ./...

## demo: as root, a three-pod "cluster" in network namespaces served by weir run
demo: build
	$(GO) run ./hack/demo --weir $(BIN)/weir --manifests examples/demo

## bench: scale benchmarks (1k and 10k services x 10 endpoints); figures go to docs/performance.md
bench: build
	$(GO) test -run '^$$' -bench . -benchmem -benchtime 3x ./backends/nftables/
	$(GO) test -run '^$$' -bench 'Load|Reload|Decode' -benchtime 10x ./core/source/files/
	$(GO) run ./hack/bench --weir $(BIN)/weir --services 1000,10000

## lint: gofmt and go vet on both modules
lint:
	@out=$$(gofmt -l .); \
	  if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)
	cd sdk && $(GO) vet ./...

clean:
	rm -rf $(BIN)
