"""One real control plane per test session; tests isolate by namespace, driver and name.

The binaries must already be there (``make test-cluster`` builds them first):
a missing control plane is an error that fails the run, never a skip.
"""

from __future__ import annotations

import json
import os
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import yaml

from gpuslice.devcluster.cluster import ClusterSpec, DevCluster
from gpuslice.devcluster.ports import PORTS_ENV, port_range
from gpuslice.kube.client import KubeClient

# Fixtures of every folder of the tier (pytest takes a conftest's names as fixtures): the controller
# and the maxMemory webhook as their own processes, policies and namespaces, fake GPU nodes with
# their agents, the inspecting CLI as a viewer.
from tests.cluster.cli import gpuslice, viewer_kubeconfig
from tests.cluster.gpu_nodes import agent_rbac, gpu_node
from tests.cluster.kubeutil import POLICIES, ClusterObjects, create_namespace, delete_namespace, dev_cluster, wait_for
from tests.cluster.operator_fixtures import controller, controller_kubeconfig, make_policy, memory_webhook, namespaces
from tests.cluster.tiers import K136, LONG_FILES

__all__ = ["agent_rbac", "controller", "controller_kubeconfig", "gpu_node", "gpuslice", "make_policy", "memory_webhook",
           "namespaces", "viewer_kubeconfig"]

NODES = 2
GPUS_PER_NODE = 8


def _ports_of_this_worker() -> None:
    """With several workers (``-n``, pytest-xdist), each starts its own control plane; each draws
    its ports from a range of its own, so two never take the same free port between a check and a
    bind. Set before any test runs, and inherited by every process a test starts."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER", ""), os.environ.get("PYTEST_XDIST_WORKER_COUNT", "")
    if not worker.startswith("gw") or not count.isdigit() or PORTS_ENV in os.environ:
        return
    ports = port_range()
    share = len(ports) // int(count)
    low = ports.start + int(worker.removeprefix("gw")) * share
    os.environ[PORTS_ENV] = f"{low}-{low + share}"


_ports_of_this_worker()


def _file(item: pytest.Item) -> str:
    return item.nodeid.split("::", 1)[0]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # The long files first (tiers.LONG_FILES), then the others by their number of tests; each file's
    # tests stay together and in their order (the Makefile turns xdist's own reordering off).
    rank, tests = {f: i for i, f in enumerate(LONG_FILES)}, Counter(_file(item) for item in items)
    items.sort(key=lambda item: (rank.get(_file(item), len(rank)), -tests[_file(item)], _file(item)))
    for item in items:
        item.add_marker(pytest.mark.cluster)
        # The fake backend's variant only: the GPU backend is no part of what 1.36 changes (tiers.py).
        backend = getattr(item, "callspec", None) and item.callspec.params.get("gpu_backend")  # type: ignore[attr-defined]
        if item.nodeid.split("[", 1)[0] in K136 and backend in (None, "fake"):
            item.add_marker(pytest.mark.k136)


LOG_TAIL = 40  # lines of each of gpuslice's own components, warnings and errors only


def _log_tail(path: Path) -> str:
    """The last warnings and errors of one structlog JSON log (what a failed test was waiting on)."""
    kept = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            level = json.loads(line).get("level")
        except ValueError:
            level = "error"  # a traceback or a line not ours
        if level not in ("debug", "info"):
            kept.append(line[:400])
    return "\n".join(kept[-LOG_TAIL:])


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A failed test's report carries the tail of gpuslice's component logs: CI keeps nothing else."""
    outcome = yield
    report = outcome.get_result()
    if report.when != "call" or not report.failed:
        return
    paths: list[Path] = []
    for name, value in getattr(item, "funcargs", {}).items():
        if isinstance(value, DevCluster):
            paths += sorted(value.state.logs.glob("gpuslice-*.log"))
        elif isinstance(getattr(value, "log", None), Path) and name in ("controller", "memory_webhook"):
            paths.append(value.log)  # ControllerProcess, WebhookProcess
        elif name == "tmp_path" and isinstance(value, Path):  # the test's own agents (gpu_node)
            paths += sorted(value.glob("agent-*.log"))
    for path in paths:
        if path.is_file():
            report.sections.append((f"{path.name} (warnings and errors, last {LOG_TAIL})", _log_tail(path)))


@pytest.fixture(scope="session")
async def cluster(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[DevCluster]:
    spec = ClusterSpec(tmp_path_factory.mktemp("dev-cluster"), nodes=NODES, gpus_per_node=GPUS_PER_NODE)
    async with dev_cluster(spec) as running:
        yield running


@pytest.fixture(scope="session")
async def kube(cluster: DevCluster) -> AsyncIterator[KubeClient]:
    async with await KubeClient.from_kubeconfig(cluster.kubeconfig) as client:
        yield client


@pytest.fixture(scope="session")
def kubeconfig(cluster: DevCluster) -> Path:
    return cluster.kubeconfig


@pytest.fixture
def unique() -> str:
    """A short random suffix so cluster-scoped names never collide between tests."""
    return uuid.uuid4().hex[:8]


@pytest.fixture
async def namespace(kube: KubeClient, unique: str) -> AsyncIterator[str]:
    """A fresh namespace whose default ServiceAccount exists (pods need it to be admitted)."""
    name = await create_namespace(kube, f"t-{unique}")
    yield name
    await delete_namespace(kube, name)


@pytest.fixture
async def cluster_objects(kube: KubeClient) -> AsyncIterator[ClusterObjects]:
    objects = ClusterObjects(kube)
    yield objects
    await objects.delete_all()


CRD_FILE = Path(__file__).resolve().parents[2] / "crds" / "gpuslicepolicies.gpuslice.dev.yaml"
LEDGER_CRD_FILE = CRD_FILE.parent / "gpusliceledgers.gpuslice.dev.yaml"
VIEW_CRD_FILE = CRD_FILE.parent / "gpusliceagentviews.gpuslice.dev.yaml"


@pytest.fixture(scope="session")
async def policy_crd(kube: KubeClient) -> str:
    """The committed CRDs, installed as a user would install them; returns the policies' path."""
    for path in (CRD_FILE, LEDGER_CRD_FILE, VIEW_CRD_FILE):
        body = yaml.safe_load(path.read_text())
        name = body["metadata"]["name"]
        await kube.apply(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}", body,
                         field_manager="gpuslice-tests")

        async def established(name: str = name) -> bool:
            crd = await kube.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
            return any(c["type"] == "Established" and c["status"] == "True"
                       for c in (crd.get("status") or {}).get("conditions") or [])

        await wait_for(established, within=30, what=f"the CRD {name} to be established")
    return POLICIES
