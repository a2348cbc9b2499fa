# Corral. `make help` lists the targets; `make ci` is exactly what .ci/run runs
# after installing packages.
SHELL := /bin/bash
GO ?= go
BIN := $(CURDIR)/bin
TOOLS := $(CURDIR)/.bin
VERSION ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -X main.version=$(VERSION)
export PATH := $(TOOLS):$(PATH)

BUF_VERSION := v1.50.0
PROTOC_GEN_GO_VERSION := v1.36.6
PROTOC_GEN_GO_GRPC_VERSION := v1.5.1
PROTOC_GEN_OPENAPIV2_VERSION := v2.33.0
GRPCURL_VERSION := v1.9.3
GOTESTSUM_VERSION := v1.13.0
NFPM_VERSION := v2.41.3
GOLANGCI_LINT_VERSION := v2.15.0

.PHONY: help build test test-short bench generate check-generate tools vet fmt-check ci run clean

# Modules of their own in this repository (each has its go.mod): ./... from
# the root does not enter them, so vet, lint, tidy and test visit each.
# api/ is the API module users import (api/README.md);
# terraform-provider-corral/ is the Terraform/OpenTofu provider built on it.
SUBMODULES := api terraform-provider-corral

help: ## List targets
	@grep -hE '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN{FS=":.*## "}{printf "  %-16s %s\n", $$1, $$2}'

build: ## Build corrald, corral and corral-node into ./bin
	@mkdir -p $(BIN)
	$(GO) build -ldflags '$(LDFLAGS)' -o $(BIN)/ ./cmd/...

run: build ## Run corrald on its defaults with a local data dir (./data)
	$(BIN)/corrald serve --data-dir $(CURDIR)/data

# tofu (OpenTofu, the provider's end-to-end test) cannot be go installed
# (its go.mod has a replace directive): tools/tofu/go.mod pins it and
# copies that replace. A cold build takes minutes; it is built once here.
tools: ## Install pinned buf, protoc plugins (go, go-grpc, openapiv2), grpcurl, gotestsum, nfpm, golangci-lint and tofu into ./.bin
	@mkdir -p $(TOOLS)
	@test -x $(TOOLS)/buf || GOBIN=$(TOOLS) $(GO) install github.com/bufbuild/buf/cmd/buf@$(BUF_VERSION)
	@test -x $(TOOLS)/protoc-gen-go || GOBIN=$(TOOLS) $(GO) install google.golang.org/protobuf/cmd/protoc-gen-go@$(PROTOC_GEN_GO_VERSION)
	@test -x $(TOOLS)/protoc-gen-go-grpc || GOBIN=$(TOOLS) $(GO) install google.golang.org/grpc/cmd/protoc-gen-go-grpc@$(PROTOC_GEN_GO_GRPC_VERSION)
	@test -x $(TOOLS)/protoc-gen-openapiv2 || GOBIN=$(TOOLS) $(GO) install github.com/grpc-ecosystem/grpc-gateway/v2/protoc-gen-openapiv2@$(PROTOC_GEN_OPENAPIV2_VERSION)
	@test -x $(TOOLS)/grpcurl || GOBIN=$(TOOLS) $(GO) install github.com/fullstorydev/grpcurl/cmd/grpcurl@$(GRPCURL_VERSION)
	@test -x $(TOOLS)/gotestsum || GOBIN=$(TOOLS) $(GO) install gotest.tools/gotestsum@$(GOTESTSUM_VERSION)
	@test -x $(TOOLS)/nfpm || GOBIN=$(TOOLS) $(GO) install github.com/goreleaser/nfpm/v2/cmd/nfpm@$(NFPM_VERSION)
	@test -x $(TOOLS)/golangci-lint || GOBIN=$(TOOLS) $(GO) install github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$(GOLANGCI_LINT_VERSION)
	@test -x $(TOOLS)/tofu || (cd tools/tofu && $(GO) build -trimpath -ldflags '-X github.com/opentofu/opentofu/version.dev=no' -o $(TOOLS)/tofu github.com/opentofu/opentofu/cmd/tofu)

generate: tools ## Regenerate Go code and the OpenAPI document (api/openapi) from api/**/*.proto with buf
	buf generate

check-generate: generate ## Fail if regenerating the API changes anything, or a go.mod is untidy
	@for m in . $(SUBMODULES); do (cd $$m && $(GO) mod tidy -diff) || { echo "go.mod of $$m is untidy: run go mod tidy there" >&2; exit 1; }; done
	@git diff --exit-code -- api || (echo "generated code is stale: run make generate and commit" >&2; exit 1)
	@test -z "$$(git status --porcelain -- api)" || (git status --porcelain -- api; echo "untracked generated files: run make generate and commit" >&2; exit 1)

# golangci-lint with the curated set in .golangci.yml, and buf lint at
# STANDARD with the exceptions buf.yaml lists and explains.
.PHONY: lint
lint: tools ## golangci-lint (.golangci.yml) and buf lint (buf.yaml)
	$(TOOLS)/golangci-lint run ./...
	@for m in $(SUBMODULES); do (cd $$m && $(TOOLS)/golangci-lint run ./...) || exit 1; done
	$(TOOLS)/buf lint

vet: ## go vet (every module) and gofmt check
	$(GO) vet ./...
	@for m in $(SUBMODULES); do (cd $$m && $(GO) vet ./...) || exit 1; done
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || (gofmt -l $$(git ls-files '*.go'); echo "gofmt needed" >&2; exit 1)

# -p 1: packages run one at a time, so the QEMU end-to-end suites (boot,
# images, hypervisor, BMC) never share the 2 CI cores with each other.
# gotestsum runs go test -json: a line per package, the output of every
# failing test, and at the end a summary counting the tests skipped and
# listing each with its reason (a missing tool fails instead under CI=true,
# see testsupport/require). PKGS narrows the run: make test PKGS=./ipmi/...
# The virtual rack's package (cmd/corral-lab: deploy, RAID, erase, standby)
# takes about 25 minutes on a fresh 2-core machine, hence the 50-minute
# timeout a package.
# Every test's events go to TEST_JSON, and the tests that took a minute or
# more are listed after the run, pass or fail (where CI's time goes).
PKGS ?= ./...
TEST_JSON ?= $(or $(CORRAL_TEST_ARTIFACTS),/tmp)/go-test.json
test: tools ## Run every test with -race (end-to-end tests included); ends with the skipped tests and why
	@rc=0; $(TOOLS)/gotestsum --jsonfile $(TEST_JSON) --format pkgname-and-test-fails --format-hide-empty-pkg -- -race -count=1 -p 1 -timeout 50m $(PKGS) || rc=$$?; \
	  echo "tests of 60 s or more:"; $(TOOLS)/gotestsum tool slowest --jsonfile $(TEST_JSON) --threshold 60s; exit $$rc
	@if [ "$(PKGS)" = "./..." ]; then for m in $(SUBMODULES); do (cd $$m && $(TOOLS)/gotestsum --format pkgname-and-test-fails --format-hide-empty-pkg -- -race -count=1 -timeout 10m ./...) || exit 1; done; fi

test-short: ## Unit tests only (-short skips process and end-to-end tests)
	$(GO) test -race -short -count=1 ./...

bench: ## Print API benchmark figures (ReserveCompute/ReserveNetworkInterface over TLS gRPC on bbolt)
	$(GO) test -run '^$$' -bench . -benchtime 3s ./appliance/

# The OS-image deploy benchmark (bench/deploy.sh, root): corrald's raw
# image route against nginx for 10 concurrent deploys, the agent's writer
# against bmaptool, erase rates per level; interleaved, printed, never
# asserted. Needs nginx, bmap-tools and qemu-utils; bench/README.md says more.
.PHONY: bench-deploy
bench-deploy: ## Serve, write and erase a 2 GiB mostly empty OS image: corrald vs nginx, agent vs bmaptool, erase levels (root, nginx, bmap-tools, qemu-utils)
	sh bench/deploy.sh

# The fleet storm (testsupport/fleetsim): corrald and corral-sim built
# without -race, run as root (two network namespaces, removed at the end).
# Prints per-phase p50/p99, corrald's CPU/RSS/store beside the figures
# recorded in bench/fleet-baseline.json; RECORD=1 records this run's.
# FLEET_ARGS passes more corral-sim flags (corral-sim -h).
MACHINES ?= 1000
NODES ?= 1000
FLEET_DIR ?= /var/tmp/corral-fleet
.PHONY: bench-fleet
bench-fleet: ## Power on MACHINES simulated machines and NODES nodes against the built corrald (root); last line: fleet: ... summary
	@mkdir -p $(FLEET_DIR)/bin
	$(GO) build -o $(FLEET_DIR)/bin/ ./cmd/corrald ./testsupport/fleetsim/cmd/corral-sim
	$(FLEET_DIR)/bin/corral-sim -corrald $(FLEET_DIR)/bin/corrald -machines $(MACHINES) -nodes $(NODES) \
		-work-dir $(FLEET_DIR)/run -baseline $(CURDIR)/bench/fleet-baseline.json $(if $(RECORD),-record) $(FLEET_ARGS)

# The storm against a fleet: STORM_APPLIANCES corrald on a three-member
# etcd cluster (local etcd-server processes in a namespace of the run),
# each in its own namespace on the one boot segment, all serving DHCP;
# STORM_MACHINES powered on over STORM_RAMP. Prints the figures above per
# appliance and per etcd member; bench/README.md says what it costs.
STORM_MACHINES ?= 10000
STORM_NODES ?= $(STORM_MACHINES)
STORM_APPLIANCES ?= 3
STORM_RAMP ?= 60s
.PHONY: bench-fleet-storm
bench-fleet-storm: ## Power on STORM_MACHINES (10000) machines over STORM_RAMP (60s) against STORM_APPLIANCES (3) corrald on a three-member etcd (root, etcd-server)
	@mkdir -p $(FLEET_DIR)/bin
	$(GO) build -o $(FLEET_DIR)/bin/ ./cmd/corrald ./testsupport/fleetsim/cmd/corral-sim
	$(FLEET_DIR)/bin/corral-sim -corrald $(FLEET_DIR)/bin/corrald -appliances $(STORM_APPLIANCES) -machines $(STORM_MACHINES) -nodes $(STORM_NODES) \
		-stagger $(STORM_RAMP) -work-dir $(FLEET_DIR)/storm -baseline $(CURDIR)/bench/fleet-baseline.json $(if $(RECORD),-record) $(FLEET_ARGS)

ci: check-generate vet lint test ## What .ci/run runs after installing packages

clean: ## Remove build outputs
	rm -rf $(BIN) $(DIST)

.PHONY: docs
docs: ## Regenerate the CLI reference docs/cli/*.md from corral's and corrald's command trees (tests check it is current)
	CORRAL_WRITE_DOCS=1 go test -count=1 -run '^TestCLIReference$$' ./cmd/corral/cli ./cmd/corrald

.PHONY: images
images: build ## Build (or take from the cache) the discovery and hypervisor images and register them in DATA_DIR's catalog (default ./data)
	$(BIN)/corrald images build --data-dir $(or $(DATA_DIR),$(CURDIR)/data) --source $(CURDIR)

# The virtual rack (corral-lab): corrald in a network namespace with QEMU
# machines behind ipmi_sim BMCs. corral-lab apt-get installs the packages it
# misses (qemu-system-x86 qemu-utils ovmf ipxe openipmi ipmitool ...), builds
# corrald/corral into LAB_DIR/bin and the images into the image cache.
LAB_DIR ?= /var/lib/corral-lab
LAB_ARGS ?= --machines 2 --with-bmc --firmware bios,uefi

.PHONY: lab lab-down
lab: ## Start the virtual rack (root): corral-lab up $(LAB_ARGS) in LAB_DIR; then corral-lab status|report
	$(GO) run ./cmd/corral-lab --dir $(LAB_DIR) up $(LAB_ARGS)

lab-down: ## Stop the virtual rack: its processes, namespace, bridge, taps and veth (images stay)
	$(GO) run ./cmd/corral-lab --dir $(LAB_DIR) down

# Release: what an operator installs. dist/ gets the four static binaries
# (CGO_ENABLED=0, -trimpath, the version stamped), the images archive
# (corrald images build, then corrald images export: kernel, initramfs
# images, iPXE binaries, MANIFEST.json and SHA256SUMS), the .deb made by
# nfpm from packaging/nfpm.yaml, and SHA256SUMS over all of them. The images
# are built with the host's apt and Go (IMAGE_CACHE: the build cache, default
# corrald's); the appliance installing the .deb needs neither.
DIST := $(CURDIR)/dist
RELEASE_CMDS := corrald corral corral-node corral-lab
IMAGE_CACHE ?=
# The Debian version: a v1.2.3 tag is 1.2.3, commits past it 1.2.3+4.gHASH;
# with no tag 0.0.0+gHASH (dpkg wants a leading digit).
DEB_VERSION ?= $(shell v=$$(git describe --tags --match 'v[0-9]*' --dirty 2>/dev/null) && echo "$$v" | sed -e 's/^v//' -e 's/-\([0-9]*\)-g/+\1.g/' -e 's/-dirty$$/.dirty/' || echo "0.0.0+g$$(git describe --always --dirty 2>/dev/null | tr - .)")

.PHONY: release release-bin release-images deb
release: ## Static binaries, images archive, .deb and SHA256SUMS into ./dist
	$(MAKE) release-images
	$(MAKE) deb
	cd $(DIST) && rm -f SHA256SUMS && sha256sum $(RELEASE_CMDS) corral-images.tar corral_*_amd64.deb > SHA256SUMS.tmp && mv SHA256SUMS.tmp SHA256SUMS
	@cat $(DIST)/SHA256SUMS

release-bin: ## Static binaries of corrald, corral, corral-node and corral-lab into ./dist
	@mkdir -p $(DIST)
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS) -s -w' -o $(DIST)/ $(addprefix ./cmd/,$(RELEASE_CMDS))

release-images: release-bin ## The images archive dist/corral-images.tar (built, or taken from the image cache)
	rm -rf $(DIST)/.catalog
	$(DIST)/corrald images build --data-dir $(DIST)/.catalog --source $(CURDIR) $(if $(IMAGE_CACHE),--image-cache $(IMAGE_CACHE))
	$(DIST)/corrald images export --data-dir $(DIST)/.catalog -o $(DIST)/corral-images.tar
	rm -rf $(DIST)/.catalog

deb: ## The .deb (nfpm, packaging/nfpm.yaml) from what release-bin and release-images put in ./dist
	@test -x $(TOOLS)/nfpm || { mkdir -p $(TOOLS) && GOBIN=$(TOOLS) $(GO) install github.com/goreleaser/nfpm/v2/cmd/nfpm@$(NFPM_VERSION); }
	@test -f $(DIST)/corrald -a -f $(DIST)/corral -a -f $(DIST)/corral-images.tar || { echo "dist/ lacks corrald, corral or corral-images.tar: make release-bin release-images" >&2; exit 1; }
	rm -f $(DIST)/corral_*_amd64.deb
	CORRAL_DEB_VERSION='$(DEB_VERSION)' $(TOOLS)/nfpm pkg -f packaging/nfpm.yaml -p deb -t $(DIST)/
