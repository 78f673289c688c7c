"""The faults tier: a control plane of its own (it is stalled, restarted and has processes killed),
with gpuslice installed and running as in `gpuslice dev-cluster up`: the controller and one agent
per fake node, each a supervised process with its own identity. The scheduler reaches the API
server through a proxy a test can hold. An invariant checker runs through every test."""

from __future__ import annotations

import asyncio
import contextlib
import os
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

from gpuslice.devcluster.cluster import ClusterSpec, DevCluster
from gpuslice.kube.client import NO_RETRY, KubeClient, KubeError, NotFound
from tests.cluster.faults.invariants import InvariantChecker
from tests.cluster.faults.shape import CONTROLLER_MANAGER_BACK, NODES, PolicyMaker
from tests.cluster.kubeutil import POLICIES, create_namespace, delete_namespace, dev_cluster, wait_for

RESOURCE = "/apis/resource.k8s.io/v1"


@pytest.fixture(scope="package")
async def faults_cluster(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[DevCluster]:
    spec = ClusterSpec(tmp_path_factory.mktemp("faults-cluster"), nodes=len(NODES), gpus_per_node=2,
                       gpu_model="h100-80gb", operator=True, proxied_scheduler=True)
    async with dev_cluster(spec) as cluster:
        yield cluster


@pytest.fixture(scope="package")
async def fkube(faults_cluster: DevCluster) -> AsyncIterator[KubeClient]:
    async with await KubeClient.from_kubeconfig(faults_cluster.kubeconfig) as client:
        yield client


@pytest.fixture(autouse=True)
async def invariants(faults_cluster: DevCluster) -> AsyncIterator[InvariantChecker]:
    """Runs through the whole test; the test fails if an invariant broke at any moment."""
    async with await KubeClient.from_kubeconfig(faults_cluster.kubeconfig, request_timeout=5,
                                                retry=NO_RETRY) as client:
        checker = InvariantChecker(client)
        stop = asyncio.Event()
        task = asyncio.create_task(checker.run(stop))
        try:
            yield checker
        finally:
            if faults_cluster.proxy is not None:
                faults_cluster.proxy.release()
            await checker.check()
            stop.set()
            await task
    checker.assert_held()


@pytest.fixture
async def fns(fkube: KubeClient) -> AsyncIterator[str]:
    # A test that restarts the API server waits, at its teardown, for kube-controller-manager to act
    # again (controller_manager_back): a namespace here gets its ServiceAccount at once.
    name = await create_namespace(fkube, f"f-{uuid.uuid4().hex[:8]}")
    yield name
    await delete_namespace(fkube, name)


@pytest.fixture
async def fpolicy(fkube: KubeClient) -> AsyncIterator[PolicyMaker]:
    """Make a policy for one tenant on one node; deleted (and waited for) after the test."""
    made: list[str] = []

    async def make(namespace: str, node: str, slicing: dict[str, Any], template: str = "gpu-slice") -> str:
        name = f"p-{uuid.uuid4().hex[:8]}"
        await fkube.create(POLICIES, {"apiVersion": "gpuslice.dev/v1alpha1", "kind": "GpuSlicePolicy",
                                      "metadata": {"name": name},
                                      "spec": {"nodeSelector": {"matchLabels": {"kubernetes.io/hostname": node}},
                                               "slicing": slicing, "tenants": [{"namespace": namespace}],
                                               "claimTemplateName": template}})
        made.append(name)

        async def template_ready() -> bool:
            try:
                await fkube.get(f"{RESOURCE}/namespaces/{namespace}/resourceclaimtemplates/{template}")
            except NotFound:
                return False
            return True

        await wait_for(template_ready, within=30, what=f"the claim template of {name}")
        return name

    yield make
    for name in made:
        with contextlib.suppress(KubeError):
            await fkube.delete(f"{POLICIES}/{name}")


@pytest.fixture(autouse=True)
def no_failpoints_leak() -> None:
    assert "GPUSLICE_FAILPOINTS" not in os.environ, "a failpoint must be armed per component, never for the test run"


async def controller_manager_back(kube: KubeClient) -> None:
    """The restart is over for the next test only once kube-controller-manager acts again. Its
    informers (the ServiceAccount controller's among them) list again only when client-go's
    reflector backoff is up, 30 s at most jittered to 60 s (and the restarted API server's authorizer
    may refuse them for a moment first): a namespace made at once may wait longer than the 30 s that
    tests give its default ServiceAccount. A canary namespace shows when it is over."""
    name = f"f-canary-{os.urandom(3).hex()}"
    try:
        await create_namespace(kube, name, within=CONTROLLER_MANAGER_BACK)
    finally:
        with contextlib.suppress(NotFound):
            await kube.delete(f"/api/v1/namespaces/{name}")


@pytest.fixture
async def kube_controller_manager_back(fkube: KubeClient) -> AsyncIterator[None]:
    """For a test that restarts the API server: its teardown, pass or fail, waits for
    kube-controller-manager to act again (``controller_manager_back``)."""
    yield
    await controller_manager_back(fkube)
