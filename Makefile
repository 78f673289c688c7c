# gpuslice: `make demo` shows it, `make test` proves it. Every target says what it does.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
PYTEST ?= $(BIN)/pytest

.DEFAULT_GOAL := help
.PHONY: help venv kube-bin lint test test-unit test-cluster test-faults demo crds protos bench clean

help:
	@echo "make crds          regenerate crds/ and manifests/admission.yaml from operator/gpuslice (api, planning)"
	@echo "make protos        regenerate the kubelet plugin's gRPC code from operator/gpuslice/agent/kubeletplugin/proto/*.proto"
	@echo "make demo          bring up a real local control plane with fake GPU nodes and show it"
	@echo "make test          lint + unit tests + cluster tests against the real control plane"
	@echo "make kube-bin      build kube-apiserver/scheduler/controller-manager/etcd and pod-runner from Go modules (cached)"
	@echo "make lint          ruff, mypy --strict, import-linter layer contracts, gofmt and go vet of hack/kube"
	@echo "make test-unit     fast tests, no cluster"
	@echo "make test-cluster  tests against the real control plane (the faults tier included)"
	@echo "make test-faults   only the faults tier: stalls, restarts and kills, with an invariant checker"
	@echo "make bench         packing, scheduler cost, scale and planner figures against their targets (not in make test)"

$(STAMP): pyproject.toml
	@echo ">> setting up $(VENV): gpuslice and its dev tools"
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@$(BIN)/python -m pip install --quiet --upgrade pip
	@$(BIN)/python -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

venv: $(STAMP)

kube-bin: $(STAMP)
	@echo ">> control-plane binaries (Kubernetes from Go modules, cached by content hash)"
	@$(BIN)/gpuslice dev-cluster build

lint: $(STAMP)
	@echo ">> ruff"
	@$(BIN)/ruff check operator tests
	@echo ">> mypy --strict"
	@$(BIN)/mypy
	@echo ">> import-linter (layer contracts)"
	@cd operator && ../$(BIN)/lint-imports ../pyproject.toml
	@echo ">> gofmt, go vet (hack/kube: the pod runner)"
	@if command -v go >/dev/null; then \
		unformatted=$$(cd hack/kube && gofmt -l .); \
		if [ -n "$$unformatted" ]; then echo "gofmt: not formatted: $$unformatted (run gofmt -w hack/kube)"; exit 1; fi; \
		cd hack/kube && nice -n 10 go vet ./...; \
	else \
		echo "go not found: gofmt and go vet of hack/kube NOT run (install Go 1.26+; CI runs them)"; \
	fi

test-unit: $(STAMP)
	@echo ">> unit tests"
	@$(PYTEST) tests/unit

test-cluster: kube-bin
	@echo ">> cluster tests (real etcd, kube-apiserver, kube-scheduler, kube-controller-manager)"
	@$(PYTEST) tests/cluster

test-faults: kube-bin
	@echo ">> faults tier (stalled, restarted and killed components; invariants checked throughout)"
	@$(PYTEST) tests/cluster/faults

test: lint test-unit test-cluster

demo: kube-bin
	@echo ">> demo: local control plane with fake GPU nodes"
	@$(BIN)/gpuslice demo

# Figures for the README and bench/results.json; BENCH_SIZE=small for a quick run, BENCH_ONLY=packing,planner
# for some figures. Needs an idle machine: the full size takes a while (see bench/README.md).
bench: kube-bin
	@echo ">> bench: figures against their targets on the real scheduler (results in bench/)"
	@$(BIN)/python -c 'import matplotlib' 2>/dev/null || $(BIN)/python -m pip install --quiet -e '.[dev,bench]'
	@$(BIN)/python -m gpuslice.bench

crds: $(STAMP)
	@echo ">> generating crds/ from operator/gpuslice/api, manifests/admission.yaml from planning/admission.py"
	@$(BIN)/python -m gpuslice.api.crd > crds/gpuslicepolicies.gpuslice.dev.yaml
	@$(BIN)/python -m gpuslice.planning.admission > manifests/admission.yaml

protos: $(STAMP)
	@echo ">> generating the kubelet plugin's gRPC code (grpcio-tools, pinned in pyproject.toml)"
	@$(BIN)/python -m gpuslice.agent.kubeletplugin.proto.generate

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache
