# Weir's build, test, demo and benchmark entry points.
GO        ?= go
BIN       := bin
VERSION   ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS   := -X main.version=$(VERSION)
PKGS      := ./...

# Example hook plugins: Go ones build with the Go toolchain; local-boost is
# Rust, built with Debian's rustc and its wasm32-wasi standard library
# (packages rustc, libstd-rust-dev-wasm32 and lld; see rust-plugins);
# as-same-zone is AssemblyScript (Node.js and npm; see as-plugins).
GO_PLUGINS := canary zone-preference drain affinity least-conn
RUSTC      ?= /usr/bin/rustc

.PHONY: all build plugins test test-fast test-vm vm-tools demo bench bench-vm lint fuzz clean

all: build

## build: the weir binary in bin/
build:
	CGO_ENABLED=0 $(GO) build -ldflags "$(LDFLAGS)" -o $(BIN)/weir ./cmd/weir

## plugins: the example hook plugins, to bin/plugins/*.wasm
plugins: $(GO_PLUGINS:%=$(BIN)/plugins/%.wasm) rust-plugins as-plugins

# The Rust plugins need Debian's Rust toolchain for wasm32-wasi. Without it
# make plugins says what to install and skips them; under CI=true it fails.
RUST_PLUGINS := $(BIN)/plugins/local-boost.wasm
RUST_DEBS    := rustc libstd-rust-dev-wasm32 lld
RUST_LLD     := /usr/bin/rust-lld
# RUST_CHECK prints what of the toolchain is missing, a line each.
RUST_CHECK    = for f in $(RUSTC) $(RUST_LLD); do test -x $$f || echo $$f; done; \
  test -x $(RUSTC) && test -d "$$($(RUSTC) --print sysroot)/lib/rustlib/wasm32-wasi" || echo the wasm32-wasi standard library

.PHONY: rust-plugins
rust-plugins:
	@missing="$$( ($(RUST_CHECK)) | paste -sd, - | sed 's/,/, /g')"; \
	if [ -z "$$missing" ]; then exec $(MAKE) --no-print-directory $(RUST_PLUGINS); fi; \
	msg="the Rust plugins ($(notdir $(RUST_PLUGINS:.wasm=))) need $$missing: install the Debian packages $(RUST_DEBS) (apt-get install $(RUST_DEBS))"; \
	if [ "$(CI)" = true ]; then echo "error: $$msg" >&2; exit 1; fi; \
	echo "make plugins: not building them, because $$msg" >&2

# The AssemblyScript plugins need Node.js 20 or later and npm, which
# install the compiler pinned by sdk/assemblyscript/package-lock.json
# into sdk/assemblyscript/node_modules. Without them make plugins says so
# and skips them; under CI=true it fails.
AS_SDK     := sdk/assemblyscript
ASC        := $(AS_SDK)/node_modules/.bin/asc
AS_PLUGINS := $(BIN)/plugins/as-same-zone.wasm

.PHONY: as-plugins
as-plugins:
	@if command -v node >/dev/null && command -v npm >/dev/null && \
	  node -e 'process.exit(Number(process.versions.node.split(".")[0]) < 20 ? 1 : 0)'; then \
	  exec $(MAKE) --no-print-directory $(AS_PLUGINS); fi; \
	msg="the AssemblyScript plugins ($(notdir $(AS_PLUGINS:.wasm=))) need Node.js 20 or later and npm"; \
	if [ "$(CI)" = true ]; then echo "error: $$msg" >&2; exit 1; fi; \
	echo "make plugins: not building them, because $$msg" >&2

$(ASC): $(AS_SDK)/package.json $(AS_SDK)/package-lock.json
	cd $(AS_SDK) && npm ci --no-audit --no-fund --loglevel=error
	@touch $@

$(BIN)/plugins/as-%.wasm: plugins/as-%/index.ts $(AS_SDK)/assembly/index.ts $(ASC)
	@mkdir -p $(@D)
	$(ASC) $< --outFile $@ --runtime incremental --optimizeLevel 3 --shrinkLevel 1 \
	  --use abort=$(AS_SDK)/assembly/index/abort

# go build decides itself whether anything changed.
$(BIN)/plugins/%.wasm: FORCE
	GOOS=wasip1 GOARCH=wasm $(GO) build -buildmode=c-shared -o $@ ./plugins/$*

# The Rust SDK (sdk/rust), compiled once for the Rust plugins to link.
RUST_SDK := $(BIN)/rust/libweir_plugin.rlib
$(RUST_SDK): $(wildcard sdk/rust/src/*.rs)
	@mkdir -p $(@D)
	$(RUSTC) --edition 2021 --target wasm32-wasi --crate-type rlib --crate-name weir_plugin -C opt-level=s \
	  -o $@ sdk/rust/src/lib.rs

$(BIN)/plugins/local-boost.wasm: plugins/local-boost/src/lib.rs $(RUST_SDK)
	@mkdir -p $(BIN)/plugins
	$(RUSTC) --edition 2021 --target wasm32-wasi --crate-type cdylib -C opt-level=s -C lto \
	  -C strip=symbols -C linker=/usr/bin/rust-lld --extern weir_plugin=$(RUST_SDK) -o $@ $<

FORCE:

## test: lint, then every test of both modules (kernel tests need root; under CI=true they never skip), each fuzz target for 5 s, then test-vm, e2e and a two-minute soak
test: lint plugins vm-tools
	$(GO) test -count=1 -race $(PKGS)
	cd sdk && $(GO) test -count=1 -race ./...
	$(MAKE) fuzz FUZZTIME=5s
	$(MAKE) test-vm
	$(MAKE) e2e
	$(MAKE) soak $(SOAK_SHORT)

## test-fast: for everyday work, the unit tests of both modules with -short: no kernel, VM or control plane (kernel and VM tests skip even under CI=true); about a minute on two cores
test-fast:
	$(GO) test -short -count=1 $(PKGS)
	cd sdk && $(GO) test -short -count=1 ./...

# The modules the nftables backend's kernel tests load in the VM.
NFT_MODULES := nf_tables,nf_conntrack,nf_nat,nft_chain_nat,nft_ct,nft_fib_inet,nft_fib_ipv4,nft_fib_ipv6,nft_numgen,nft_reject_inet,nft_masq,veth
# The host programs they run: nft and ip (ip netns exec) tamper with the tables.
NFT_FILES := /usr/sbin/nft,/usr/sbin/ip

comma := ,
space := $(subst ,, )

# The modules and host programs the iptables backend's kernel tests need in
# the VM: both flavours' tools for both families, their extensions, ip.
IPT_MODULES := ip_tables,iptable_nat,iptable_filter,ip6_tables,ip6table_nat,ip6table_filter,nf_tables,nft_compat,nft_chain_nat,nf_nat,nf_conntrack,xt_comment,xt_statistic,xt_recent,xt_mark,xt_conntrack,xt_addrtype,xt_tcpudp,xt_MASQUERADE,xt_nat,ipt_REJECT,ip6t_REJECT,xt_multiport,veth
IPT_TOOLS   := $(foreach t,iptables ip6tables,$(foreach f,legacy nft,$(foreach s,- -restore -save,/usr/sbin/$(t)-$(f)$(patsubst -,,$(s)))))
IPT_FILES   := $(subst $(space),$(comma),$(IPT_TOOLS) /usr/lib/x86_64-linux-gnu/xtables /usr/sbin/ip)

# The modules the IPVS backend's kernel tests load in the VM: IPVS with
# every scheduler it accepts, conntrack, the dummy and veth interfaces, and
# for its iptables layer the ipset types, both iptables flavours' nat and
# filter tables and the matches and targets its rules use.
IPVS_MODULES := ip_vs,ip_vs_rr,ip_vs_wrr,ip_vs_lc,ip_vs_wlc,ip_vs_sh,ip_vs_dh,ip_vs_sed,ip_vs_nq,ip_vs_mh,nf_conntrack,dummy,veth,ip_set,ip_set_hash_ipport,ip_set_hash_ipportip,ip_set_hash_ipportnet,xt_set,ip_tables,iptable_nat,iptable_filter,ip6_tables,ip6table_nat,ip6table_filter,nf_tables,nft_compat,nft_chain_nat,nf_nat,xt_mark,xt_conntrack,xt_MASQUERADE,xt_comment,xt_tcpudp

## test-vm: as root, the backends' kernel tests again inside a VM booting Debian 12's LTS kernel (test/vm; the kernel package is cached in ~/.cache/weir-vm)
test-vm: vm-tools $(BIN)/plugins/least-conn.wasm
	@mkdir -p $(BIN)/vm
	CGO_ENABLED=0 $(GO) test -c -o $(BIN)/vm/nftables.test ./backends/nftables/
	CGO_ENABLED=0 $(GO) test -c -o $(BIN)/vm/iptables.test ./backends/iptables/
	CGO_ENABLED=0 $(GO) test -tags vm -c -o $(BIN)/vm/ipvs.test ./backends/ipvs/
	$(GO) run ./hack/vmtest --modules $(NFT_MODULES) --host-files $(NFT_FILES) $(BIN)/vm/nftables.test -test.run 'TestKernel|TestConformance' -test.v
	$(GO) run ./hack/vmtest --timeout 30m --modules $(IPT_MODULES) --host-files $(IPT_FILES) $(BIN)/vm/iptables.test -test.run 'TestKernel|TestConformance' -test.v
	$(GO) run ./hack/vmtest --timeout 45m --modules $(IPVS_MODULES) --host-files $(IPT_FILES) $(BIN)/vm/ipvs.test -test.run 'TestKernel|TestConformance' -test.v
# weir sync --once, weir cleanup and weir run with the least-conn plugin in mode ipvs end to end; the VM has no Go, so
# the test binary runs itself as weir
	CGO_ENABLED=0 $(GO) test -tags vm -c -o $(BIN)/vm/weir.test ./cmd/weir/ && $(GO) run ./hack/vmtest --modules $(IPVS_MODULES) \
	  --host-files $(IPT_FILES),$(abspath $(BIN)/plugins/least-conn.wasm) --env CI=true,GO_TEST_LEAST_CONN_WASM=$(abspath $(BIN)/plugins/least-conn.wasm) \
	  $(BIN)/vm/weir.test -test.run 'TestVMIPVS|TestIPVSConfig' -test.v

## vm-tools: installs QEMU and a static busybox for the VM tests when missing (Debian)
vm-tools:
	@command -v qemu-system-x86_64 >/dev/null && command -v busybox >/dev/null || \
	  { echo "installing qemu-system-x86 and busybox-static for the VM tests"; \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends qemu-system-x86 busybox-static >/dev/null; }

## demo: as root, a three-pod "cluster" in network namespaces served by weir run
demo: build
	$(GO) run ./hack/demo --weir $(BIN)/weir --manifests examples/demo

## bench: scale benchmarks (1k, 10k and 100k services x 10 endpoints, 5k x 50 and 1 x 5000; hack/bench gives each size and mode --cap to finish in); figures go to docs/performance.md
bench: build plugins
	$(GO) test -run '^$$' -bench . -benchmem -benchtime 3x -timeout 60m ./backends/nftables/
	$(GO) test -run '^$$' -bench 'Load|Reload|Decode' -benchtime 10x ./core/source/files/
	cd sdk && $(GO) test -run '^$$' -bench . -benchmem -benchtime 10x ./abi/
	$(GO) test -run '^$$' -bench . -benchtime 5x ./hooks/
	$(GO) test -run '^$$' -bench Load -benchmem -benchtime 10x ./core/conntrack/
	$(GO) test -run '^$$' -bench 'Sync10k|Check10k' -benchmem -benchtime 3x -timeout 60m ./backends/iptables/
	$(GO) run ./hack/bench --weir $(BIN)/weir --services 1000,10000 --plugins $(BIN)/plugins --iptables legacy,nft --cap 15m
	$(GO) run ./hack/bench --weir $(BIN)/weir --services 100000,5000x50,1x5000 --cap 10m
	$(MAKE) bench-vm

# The benchmarks bench-vm runs in the VM, one boot per backend back to back
# on the same kernel and VM size: the nftables backend's at 10k, as the
# reference for ratios, then the IPVS backend's. One run of each (1x): a
# first sync at 10k takes 10-45 s under software emulation.
VM_BENCH := -test.run '^$$' -test.benchtime 1x -test.benchmem -test.timeout 55m

## bench-vm: as root, the IPVS and nftables backends' 10k benchmarks in the same VM (software emulation: compare ratios, not times)
bench-vm: vm-tools
	@mkdir -p $(BIN)/vm
	CGO_ENABLED=0 $(GO) test -tags vm -c -o $(BIN)/vm/ipvs.test ./backends/ipvs/
	CGO_ENABLED=0 $(GO) test -c -o $(BIN)/vm/nftables.test ./backends/nftables/
	$(GO) run ./hack/vmtest --timeout 60m --modules $(NFT_MODULES) $(BIN)/vm/nftables.test $(VM_BENCH) -test.bench 'FullSync10k|OneEndpointChange10k'
	$(GO) run ./hack/vmtest --timeout 60m --modules $(IPVS_MODULES) --host-files $(IPT_FILES) $(BIN)/vm/ipvs.test $(VM_BENCH) -test.bench 'Sync10k'

.PHONY: bench-compare

# The side-by-side comparison's knobs: sizes (SERVICESxENDPOINTS), the
# sizes also run with minSyncPeriod 0, modes, the cap on each run;
# COMPARE_FLAGS passes more flags to hack/compare (go run ./hack/compare
# --help). Not part of make test: the full matrix takes hours.
COMPARE_SIZES ?= 1000x10,10000x10,5000x50,30000x10
COMPARE_ZERO  ?= 10000x10
COMPARE_MODES ?= nftables,iptables-nft,iptables-legacy,ipvs
COMPARE_CAP   ?= 20m
COMPARE_FLAGS ?=

## bench-compare: as root, kube-proxy v1.37 and Weir side by side on one real control plane (hack/compare, test/compare): start to first sync, full sync, one change, churn latency, RSS, CPU and kernel objects per mode; COMPARE_SIZES, COMPARE_ZERO, COMPARE_MODES, COMPARE_CAP, COMPARE_FLAGS; the table goes to stdout and bin/compare/compare.md
bench-compare: build
	dir=$$(GO=$(GO) hack/controlplane/build.sh) && \
	  WEIRTEST_CONTROLPLANE_BIN=$$dir $(GO) run ./hack/compare --weir $(BIN)/weir --kube-proxy $$dir/kube-proxy \
	    --sizes $(COMPARE_SIZES) --zero-sizes '$(COMPARE_ZERO)' --modes $(COMPARE_MODES) --cap $(COMPARE_CAP) \
	    --out $(BIN)/compare/compare.md $(COMPARE_FLAGS)

# golangci-lint, pinned, built from the Go module proxy once into a cache
# keyed by its version (about four minutes on two cores the first time).
GOLANGCI_VERSION := v2.15.0
TOOLS_CACHE      ?= $(HOME)/.cache/weir-tools
GOLANGCI         := $(TOOLS_CACHE)/golangci-lint-$(GOLANGCI_VERSION)/golangci-lint

$(GOLANGCI):
	GOBIN=$(dir $@) $(GO) install github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$(GOLANGCI_VERSION)

## lint: gofmt, go vet and golangci-lint (.golangci.yml: staticcheck, unused, errcheck, errorlint, ineffassign) on both modules and every build tag, and the import-layering test
lint: $(GOLANGCI)
	@out=$$(gofmt -l .); \
	  if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)
	$(GO) vet -tags vm ./backends/ipvs/ ./cmd/weir/
	$(GO) vet -tags e2e ./test/e2e/...
	cd sdk && $(GO) vet ./...
	$(GOLANGCI) run ./...
	cd sdk && $(GOLANGCI) run -c ../.golangci.yml ./...
	$(GO) test -count=1 ./internal/layering/

# The fuzz targets, as package:target; the sdk ones run in the sdk module.
FUZZTIME    ?= 30s
FUZZ_WEIR   := core/planner:FuzzPlan core/config:FuzzLoad core/config:FuzzKubeProxy \
               core/source/files:FuzzDecodeFile core/source/files:FuzzFastYAML core/conntrack:FuzzParseEntry
FUZZ_SDK    := abi:FuzzDecode abi:FuzzDecodeMutated abi:FuzzDecodeBatch

## fuzz: each fuzz target for FUZZTIME (default 30s): the planner, the configuration loader (YAML and KubeProxyConfiguration), the files source's decoder, conntrack's parser and the plugin ABI's decoders; seeds in each package's testdata/fuzz
fuzz:
	@set -e; for t in $(FUZZ_WEIR); do \
	  echo "fuzz $$t for $(FUZZTIME)"; \
	  PATH="$$(dirname $$(command -v $(GO))):$$PATH" hack/fuzz.sh $${t%%:*} $${t#*:} $(FUZZTIME); done
	@set -e; cd sdk && for t in $(FUZZ_SDK); do \
	  echo "fuzz sdk/$$t for $(FUZZTIME)"; \
	  PATH="$$(dirname $$(command -v $(GO))):$$PATH" ../hack/fuzz.sh $${t%%:*} $${t#*:} $(FUZZTIME); done

clean:
	rm -rf $(BIN)

.PHONY: controlplane e2e

## controlplane: kube-apiserver, kube-controller-manager and etcd for the end-to-end tests, built once from the module proxy (hack/controlplane) into ~/.cache/weir-controlplane (or $WEIRTEST_CONTROLPLANE_CACHE); prints their folder
controlplane:
	@GO=$(GO) hack/controlplane/build.sh

## e2e: the end-to-end tests against a real control plane (test/e2e, tag e2e), building it first when missing; with CI=true they never skip
e2e:
	$(GO) vet -tags e2e ./test/e2e/...
	dir=$$(GO=$(GO) hack/controlplane/build.sh) && \
	  WEIRTEST_CONTROLPLANE_BIN=$$dir CI=true $(GO) test -count=1 -tags e2e -timeout 30m -v ./test/e2e/...

.PHONY: difftest

# The differential test's knobs: the seeds (numbers and FIRST-LAST
# ranges) and the modes.
SEEDS ?= 1-20
MODES ?= nftables,iptables

## difftest: as root, the differential test against kube-proxy (hack/difftest, test/difftest): the scenario of each seed (generated Services and EndpointSlices) written through the real control plane, served by kube-proxy, Weir and kube-proxy again (the noise floor) in each mode, every probe's outcome compared; SEEDS, MODES; exits 1 on a disagreement; the table goes to stdout and bin/difftest/report.md
difftest: build
	dir=$$(GO=$(GO) hack/controlplane/build.sh) && \
	  WEIRTEST_CONTROLPLANE_BIN=$$dir $(GO) run ./hack/difftest --weir $(BIN)/weir --kube-proxy $$dir/kube-proxy \
	    --seeds $(SEEDS) --modes $(MODES)

.PHONY: soak

# The soak's knobs: how long each mode runs, the modes, the seed (empty: a
# new one, printed), the services at the start; SOAK_FLAGS passes more
# flags to hack/soak (go run ./hack/soak --help).
SOAK_DURATION ?= 10m
SOAK_MODE     ?= nftables,iptables
SOAK_SEED     ?=
SOAK_SERVICES ?= 1000
SOAK_FLAGS    ?=
# The soak make test runs: two minutes per mode, 100 services, shorter rounds and lock hold.
SOAK_SHORT    := SOAK_DURATION=2m SOAK_SERVICES=100 SOAK_MODE=nftables,iptables-legacy SOAK_FLAGS="--round 10s --lock-hold 15s"

## soak: as root, the soak (hack/soak, test/soak): seeded churn and faults against the real control plane, weir verify at every quiescent point, probes and held connections; SOAK_DURATION, SOAK_MODE, SOAK_SEED, SOAK_SERVICES; reports in bin/soak
soak: build plugins
	dir=$$(GO=$(GO) hack/controlplane/build.sh) && \
	  WEIRTEST_CONTROLPLANE_BIN=$$dir $(GO) run ./hack/soak --weir $(BIN)/weir --plugins $(BIN)/plugins --reports $(BIN)/soak \
	    --mode $(SOAK_MODE) --duration $(SOAK_DURATION) --seed '$(SOAK_SEED)' --services $(SOAK_SERVICES) $(SOAK_FLAGS)

.PHONY: soak-vm

# The soak in the VM: mode ipvs, the files source (the VM has no network for
# a control plane), fewer services and a slower churn for software emulation,
# and no plugins: the VM's emulated CPU lacks SSE4.1, which wazero's compiler
# needs (weir run with plugins dies there with SIGILL).
SOAK_VM_DURATION ?= 5m
SOAK_VM_FLAGS    ?= --services 40 --rate 1 --round 30s --sync-period 10s --no-plugins
SOAK_GUESTS      := $(BIN)/soak-guests

## soak-vm: as root, the soak in mode ipvs inside the VM with the files source; SOAK_VM_DURATION, SOAK_SEED, SOAK_VM_FLAGS
soak-vm: build plugins vm-tools
	@mkdir -p $(BIN)/vm $(SOAK_GUESTS)
	CGO_ENABLED=0 $(GO) build -o $(BIN)/vm/soak ./hack/soak
	GOOS=wasip1 GOARCH=wasm $(GO) build -buildmode=c-shared -o $(SOAK_GUESTS)/benign.wasm ./test/soak/testdata/benign
	GOOS=wasip1 GOARCH=wasm $(GO) build -buildmode=c-shared -o $(SOAK_GUESTS)/hostile.wasm ./hooks/testdata/guests/hostile
	$(GO) run ./hack/vmtest --timeout 90m --modules $(IPVS_MODULES) \
	  --host-files $(IPT_FILES),/usr/sbin/nft,$(abspath $(BIN)/weir),$(abspath $(BIN)/plugins),$(abspath $(SOAK_GUESTS)) \
	  $(BIN)/vm/soak --source files --mode ipvs --weir $(abspath $(BIN)/weir) --plugins $(abspath $(BIN)/plugins) \
	  --guests $(abspath $(SOAK_GUESTS)) --reports /tmp/soak --duration $(SOAK_VM_DURATION) --seed '$(SOAK_SEED)' $(SOAK_VM_FLAGS)
