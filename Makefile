# gpuslice: `make demo` shows it, `make test` proves it. Every target says what it does.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
PYTEST ?= $(BIN)/pytest
comma  := ,

.DEFAULT_GOAL := help
.PHONY: help venv kube-bin nvidia-bin lint test test-unit test-cluster test-faults test-136 demo crds protos bench clean manifests constraints \
        docs reference \
        kustomize image \
        kind-up kind-deploy kind-demo kind-undeploy kind-down undeploy kind-images test-kind release pin-base release-tools

# Install and kind. Defaults are what a user with Docker and kind v0.33.0 has; the kind tier
# (make test-kind) overrides them with what hack/kind/build.py built here.
KIND         ?= kind
KUBECTL      ?= kubectl
DOCKER       ?= docker
KIND_CLUSTER ?= gpuslice
KIND_CONFIG  ?= kind/cluster.yaml
KIND_CNI     ?=
# The one version (operator/gpuslice/__init__.py): the image tag, the manifests' images, the chart.
VERSION      := $(shell sed -n 's/^__version__ = "\(.*\)"$$/\1/p' operator/gpuslice/__init__.py)
IMAGE        ?= gpuslice:$(VERSION)
IMAGE_BASE   ?=
TENANT_IMAGE ?= gpuslice-tenant:0.1.0
TENANT_BASE  ?=
OVERLAY      ?= manifests/overlays/kind

help:
	@echo "make crds          regenerate crds/ and manifests/admission.yaml from operator/gpuslice (api, planning)"
	@echo "make protos        regenerate the kubelet plugin's gRPC code from operator/gpuslice/agent/kubeletplugin/proto/*.proto"
	@echo "make demo          bring up a real local control plane with fake GPU nodes and show it"
	@echo "make test          lint + unit tests + cluster tests against the real control plane"
	@echo "make kube-bin      build kube-apiserver/scheduler/controller-manager/etcd and pod-runner from Go modules (cached)"
	@echo "make nvidia-bin    build the mock libnvidia-ml and nvidia-ctk from Go modules, fetch NVIDIA's MPS daemon (cached)"
	@echo "make lint          ruff, mypy --strict, import-linter layer contracts, gofmt and go vet of hack/kube and hack/nvidia"
	@echo "make test-unit     fast tests, no cluster"
	@echo "make test-cluster  tests against the real control plane (the faults tier included)"
	@echo "make test-faults   only the faults tier: stalls, restarts and kills, with an invariant checker"
	@echo "make test-136      the 1.36 tier: tests/cluster/tiers.py's cluster tests on a stock Kubernetes 1.36 (built first)"
	@echo "make bench         packing, scheduler cost, scale and planner figures against their targets (not in make test)"
	@echo "make test-kind     the kind tier: build a kind node image here, install gpuslice on kind, check, uninstall"
	@echo "make kind-up       create a kind cluster with three fake-GPU workers (kind/cluster.yaml)"
	@echo "make kind-deploy   build the gpuslice image, load it into kind, install the kind overlay"
	@echo "make kind-demo     the example policies and a tenant pod of each mode on kind"
	@echo "make kind-undeploy uninstall gpuslice from kind, leaving nothing behind (make kind-down: delete the cluster)"
	@echo "make image         build the gpuslice image ($(IMAGE)): amd64 and arm64 with buildx, else this host's"
	@echo "make release       VERSION=x.y.z: the image (OCI layout, SBOM), chart, install.yaml, wheel, krew plugin, checksums into dist/"
	@echo "make manifests     regenerate manifests/base/static.yaml, the monitoring component, install.yaml and charts/gpuslice"
	@echo "make constraints   re-pin constraints.txt: what the image installs (runtime dependencies, no extras)"
	@echo "make docs          build the documentation site (mkdocs.yml) into build/site, strictly: a broken link fails"
	@echo "make reference     regenerate docs/reference/ (metrics, API, CLI, layout, tests) and docs/configuration.md's settings lists"

$(STAMP): pyproject.toml constraints.txt
	@echo ">> setting up $(VENV): gpuslice and its dev tools (runtime dependencies pinned by constraints.txt, as in the image)"
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@$(BIN)/python -m pip install --quiet --upgrade pip
	@$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[dev,docs]'
	@touch $(STAMP)

# The image's pins: a fresh venv with gpuslice's runtime dependencies only, frozen.
constraints:
	@echo ">> constraints.txt: resolving pyproject.toml's runtime dependencies in a fresh venv"
	@rm -rf .constraints-venv && $(PYTHON) -m venv .constraints-venv
	@.constraints-venv/bin/python -m pip install --quiet --upgrade pip
	@.constraints-venv/bin/python -m pip install --quiet .
	@{ sed -n '/^#/p' constraints.txt; .constraints-venv/bin/python -m pip freeze --exclude gpuslice; } > constraints.txt.new
	@mv constraints.txt.new constraints.txt && rm -rf .constraints-venv build
	@git diff --stat -- constraints.txt

venv: $(STAMP)

# KUBE_VERSION=1.36 builds that minor (hack/kube/go.1.36.mod) rather than go.mod's; each is cached apart.
KUBE_VERSION ?=
kube-bin: $(STAMP)
	@echo ">> control-plane binaries (Kubernetes $(or $(KUBE_VERSION),from hack/kube/go.mod) from Go modules, cached by content hash)"
	@$(BIN)/gpuslice dev-cluster build $(if $(KUBE_VERSION),--kube-version $(KUBE_VERSION))

# What the NVML nodes need (devcluster/nvidia_build.py): gpuslice's mock libnvidia-ml over go-nvml's DGX mocks and
# NVIDIA's nvidia-ctk, from Go modules, and NVIDIA's MPS binaries from Debian; each cached by content or version.
nvidia-bin: $(STAMP)
	@echo ">> NVIDIA's pieces for the mock NVML nodes (Go modules and Debian, cached)"
	@$(BIN)/python -m gpuslice.devcluster.nvidia_build

lint: $(STAMP)
	@echo ">> ruff"
	@$(BIN)/ruff check operator tests hack
	@echo ">> mypy --strict"
	@$(BIN)/mypy
	@$(BIN)/mypy --strict hack/kind/build.py hack/manifests.py hack/chart.py hack/release.py hack/krew.py
	@$(BIN)/mypy --strict hack/docs/*.py
	@echo ">> import-linter (layer contracts)"
	@cd operator && ../$(BIN)/lint-imports ../pyproject.toml
	@echo ">> gofmt, go vet (hack/kind, hack/kube: the pod runner and nodebins, hack/oci; hack/nvidia: the mock NVML library)"
	@command -v go >/dev/null || { echo "go not found: install Go 1.26+ (gofmt and go vet are part of lint)"; exit 1; }
	@test -z "$$(gofmt -l hack/kind hack/kube hack/oci hack/nvidia)" || { echo "gofmt: not formatted:"; gofmt -l hack/kind hack/kube hack/oci hack/nvidia; exit 1; }
	@# The same CGO_ENABLED and -trimpath as the builds (devcluster/binaries.py, hack/kind/build.py):
	@# vet then finds every dependency compiled in the Go build cache (make test runs kube-bin first)
	@# instead of compiling all of Kubernetes again with other flags (about 15 minutes on 2 cores).
	@cd hack/kind && GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS="-modcacherw -trimpath" nice -n 10 go vet ./...
	@cd hack/kube && GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS="-modcacherw -trimpath" nice -n 10 go vet ./...
	@cd hack/oci && GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS="-modcacherw -trimpath" nice -n 10 go vet ./...
	@# cgo, as devcluster/nvidia_build.py builds it (go-nvml's deprecation warnings are NVIDIA's header's).
	@cd hack/nvidia/mocknvml && GOTOOLCHAIN=local CGO_ENABLED=1 CGO_CFLAGS="-O2 -g -Wno-deprecated-declarations" \
		GOFLAGS="-modcacherw -trimpath" nice -n 10 go vet ./...

# kustomize: the chart and install.yaml are checked against what it renders now.
test-unit: $(STAMP) nvidia-bin kustomize
	@echo ">> unit tests"
	@$(PYTEST) tests/unit

# Each worker runs its own control plane and takes whole test files (the tier waits more than it
# computes: 2 cores were still 10% idle with three workers); CLUSTER_WORKERS=0 runs it in this
# process. The long files start first (tests/cluster/tiers.py), so xdist's own order is turned off.
CLUSTER_WORKERS ?= 3
test-cluster: kube-bin nvidia-bin kustomize
	@echo ">> cluster tests (real etcd, kube-apiserver, kube-scheduler, kube-controller-manager; $(CLUSTER_WORKERS) workers)"
	@$(PYTEST) -n $(CLUSTER_WORKERS) --dist loadfile --no-loadscope-reorder tests/cluster

test-faults: kube-bin
	@echo ">> faults tier (stalled, restarted and killed components; invariants checked throughout)"
	@$(PYTEST) tests/cluster/faults

# The same tests on a stock 1.36 (no gate, no runtime config; tests/cluster/stock checks it is stock):
# the ones tests/cluster/tiers.py marks k136. Not in `make test`: .ci/run runs it.
test-136: kustomize
	@$(MAKE) --no-print-directory kube-bin KUBE_VERSION=1.36
	@echo ">> 1.36 tier (a stock Kubernetes 1.36 control plane and pod runners; $(CLUSTER_WORKERS) workers)"
	@GPUSLICE_KUBE_VERSION=1.36 $(PYTEST) -n $(CLUSTER_WORKERS) --dist loadfile --no-loadscope-reorder -m k136 tests/cluster

# kube-bin first: lint's go vet reuses what it compiled.
test: kube-bin lint docs test-unit test-cluster

# The site, strictly: a link to a page, heading or repository file that is not there fails, and so
# does a generated page that is stale (docs/index.md must link every page: tests/unit/test_docs.py).
docs: $(STAMP)
	@echo ">> docs: the generated pages are fresh, then mkdocs build --strict into build/site"
	@$(BIN)/python hack/docs/reference.py --check
	@NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

# A stale page also fails the unit tier (tests/unit/test_docs.py).
reference: $(STAMP)
	@echo ">> regenerating docs/reference/ and docs/configuration.md's settings lists"
	@$(BIN)/python hack/docs/reference.py

demo: kube-bin
	@echo ">> demo: local control plane with fake GPU nodes"
	@$(BIN)/gpuslice demo

# Figures for the README and bench/results.json; BENCH_SIZE=small for a quick run, BENCH_ONLY=packing,planner
# for some figures, BENCH_KUBE_VERSION=1.37,1.36 for each on each minor in turn (the first's are the run's).
# Needs an idle machine: the full size takes a while (see bench/README.md).
bench: kube-bin
	@for minor in $(subst $(comma), ,$(BENCH_KUBE_VERSION)); do \
	  $(MAKE) --no-print-directory kube-bin KUBE_VERSION=$$minor || exit 1; done
	@echo ">> bench: figures against their targets on the real scheduler (results in bench/)"
	@$(BIN)/python -c 'import matplotlib' 2>/dev/null || $(BIN)/python -m pip install --quiet -e '.[dev,bench]'
	@$(BIN)/python -m gpuslice.bench

crds: $(STAMP)
	@echo ">> generating crds/ from operator/gpuslice/api, manifests/admission.yaml and memory-webhook.yaml from planning/"
	@$(BIN)/python -m gpuslice.api.crd > crds/gpuslicepolicies.gpuslice.dev.yaml
	@$(BIN)/python -m gpuslice.api.crd gpusliceledgers.gpuslice.dev.yaml > crds/gpusliceledgers.gpuslice.dev.yaml
	@$(BIN)/python -m gpuslice.api.crd gpusliceagentviews.gpuslice.dev.yaml > crds/gpusliceagentviews.gpuslice.dev.yaml
	@$(BIN)/python -m gpuslice.planning.cluster.admission > manifests/admission.yaml
	@$(BIN)/python -m gpuslice.planning.cluster.memory_rule > manifests/memory-webhook.yaml
	@$(MAKE) --no-print-directory manifests

protos: $(STAMP)
	@echo ">> generating the kubelet plugin's gRPC code (grpcio-tools, pinned in pyproject.toml)"
	@$(BIN)/python -m gpuslice.agent.kubeletplugin.proto.generate

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache

kustomize: $(STAMP)
	@echo ">> kustomize (the version kubectl v1.37 embeds, from the Go module proxy; cached)"
	@$(BIN)/python hack/kind/build.py kustomize >/dev/null

manifests: kustomize
	@echo ">> rendering manifests/base/static.yaml, the monitoring component, install.yaml and charts/gpuslice"
	@$(BIN)/python hack/manifests.py --kustomize "$$($(BIN)/python hack/kind/build.py kustomize)"

# amd64 and arm64 with buildx where it can (PUSH=1 pushes them), else this host's architecture.
image:
	@echo ">> gpuslice image $(IMAGE)"
	@DOCKER=$(DOCKER) IMAGE=$(IMAGE) IMAGE_BASE=$(IMAGE_BASE) hack/image.sh

# make release VERSION=x.y.z: every artifact of a release into dist/ (docs/release.md): the image as an
# OCI layout with its SBOMs, the chart, install.yaml pinned by digest, the wheel and sdist, the krew
# plugin, checksums. REGISTRY: where the image is to be pushed; COSIGN_KEY (COSIGN_PASSWORD) signs.
REGISTRY   ?= ghcr.io/gpuslice
COSIGN_KEY ?=
DIST       ?= dist
release: $(STAMP) kustomize
	@echo ">> release $(VERSION) into $(DIST)/: the image $(REGISTRY)/gpuslice:$(VERSION) and the rest"
	@$(BIN)/python hack/release.py --version $(VERSION) --registry $(REGISTRY) --dist $(DIST) \
	  $(if $(IMAGE_BASE),--base $(IMAGE_BASE)) $(if $(COSIGN_KEY),--cosign-key $(COSIGN_KEY))

# The release's and the monitoring checks' tools, each pinned and built from its Go module, cached by
# content hash (hack/kind/build.py): promtool (make test), helm, hack/oci, cosign, syft.
RELEASE_TOOLS := promtool helm oci cosign syft
release-tools: $(STAMP)
	@for tool in $(RELEASE_TOOLS); do $(BIN)/python hack/kind/build.py $$tool >/dev/null || exit 1; done

# The Dockerfile's base, pinned again to the digest its tag has now (needs its registry).
pin-base: $(STAMP)
	@base=$$(sed -n 's/^ARG BASE=\([^@]*\)@.*/\1/p' Dockerfile) && \
	  digest=$$("$$($(BIN)/python hack/kind/build.py oci)" digest "$$base") && \
	  sed -i "s|^ARG BASE=.*|ARG BASE=$$base@$$digest|" Dockerfile && echo ">> Dockerfile: BASE=$$base@$$digest"

# kind: three commands from a clone to tenant pods on their slices (README, "Trying it on kind").
kind-up:
	@echo ">> kind cluster $(KIND_CLUSTER) from $(KIND_CONFIG)"
	$(KIND) create cluster --name $(KIND_CLUSTER) --config $(KIND_CONFIG)
	$(if $(KIND_CNI),$(KUBECTL) apply -f $(KIND_CNI))
	$(KUBECTL) wait node --all --for=condition=Ready --timeout=300s

kind-deploy: image
	@echo ">> tenant image $(TENANT_IMAGE), loading both into kind, installing $(OVERLAY)"
	$(DOCKER) build -t $(TENANT_IMAGE) $(if $(TENANT_BASE),--build-arg BASE=$(TENANT_BASE)) examples/tenants
	@# Into the workers only: nothing of ours runs on the control plane.
	$(KIND) load docker-image --name $(KIND_CLUSTER) $(IMAGE) $(TENANT_IMAGE) \
	  --nodes $$($(KIND) get nodes --name $(KIND_CLUSTER) | grep -v control-plane | paste -sd, -)
	@# Installed before: the image tag is the same, so restart to run what was just loaded.
	@if $(KUBECTL) -n gpuslice-system get deployment/gpuslice-controller >/dev/null 2>&1; then \
	  $(KUBECTL) apply --server-side -k $(OVERLAY) && \
	  $(KUBECTL) -n gpuslice-system rollout restart deployment/gpuslice-controller deployment/gpuslice-webhook \
	    daemonset/gpuslice-agent; \
	else $(KUBECTL) apply --server-side -k $(OVERLAY); fi
	$(KUBECTL) -n gpuslice-system rollout status deployment/gpuslice-controller --timeout=300s
	$(KUBECTL) -n gpuslice-system rollout status deployment/gpuslice-webhook --timeout=300s
	$(KUBECTL) -n gpuslice-system rollout status daemonset/gpuslice-agent --timeout=300s

kind-demo:
	@KUBECTL=$(KUBECTL) hack/kind/demo.sh

undeploy kind-undeploy:
	@KUBECTL=$(KUBECTL) hack/uninstall.sh $(OVERLAY)

kind-down:
	$(KIND) delete cluster --name $(KIND_CLUSTER)

# The kind tier, here: Docker from Debian (hack/kind/docker.sh), every image built locally
# (hack/kind/build.py, cached by content hash), then tests/kind runs the targets above.
kind-images: $(STAMP)
	@hack/kind/docker.sh
	@echo ">> kind tier: building kind, the node image and its pieces here (cached by content hash)"
	@$(BIN)/python hack/kind/build.py

test-kind: kind-images nvidia-bin
	@echo ">> kind tier: kind-up, kind-deploy, NVML nodes, kind-demo, checks, upgrade, kind-undeploy, kind-down"
	@$(PYTEST) tests/kind -s -p no:cacheprovider
