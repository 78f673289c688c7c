"""Fake GPU nodes of the shape each test needs, each with its own node agent process
(fake backend, a token bound to its Node, the RBAC and admission policy of manifests/)."""

from __future__ import annotations

import base64
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
import yaml

from gpuslice.devcluster import operator
from gpuslice.devcluster.cluster import DevCluster
from gpuslice.devcluster.nodes import fake_gpu_node
from gpuslice.devcluster.ports import free_port
from gpuslice.devcluster.process import Component
from gpuslice.kube.client import KubeClient, KubeError
from tests.cluster.kubeutil import short_dir
from tests.cluster.observe import scrape
from tests.cluster.operator_fixtures import apply_manifests

AGENT_RBAC = Path(__file__).resolve().parents[2] / "manifests" / "agent-rbac.yaml"


def cluster_ca(cluster: DevCluster) -> bytes:
    """The cluster's CA certificate, for the kubeconfigs of the agents' tokens."""
    admin = yaml.safe_load(cluster.kubeconfig.read_text())
    return base64.b64decode(admin["clusters"][0]["cluster"]["certificate-authority-data"])


@pytest.fixture(scope="session")
async def agent_rbac(kube: KubeClient, policy_crd: str) -> None:
    await apply_manifests(kube, AGENT_RBAC.read_text())


class GpuNode:
    def __init__(self, name: str, agent: Component, kubeconfig: Path, metrics_port: int) -> None:
        self.name, self.agent, self.kubeconfig, self.metrics_port = name, agent, kubeconfig, metrics_port

    async def restart_agent(self) -> None:
        await self.agent.stop()
        await self.agent.start()
        await self.agent.wait_healthy()

    async def metrics(self) -> dict[str, float]:
        """The agent's Prometheus samples, by name with labels."""
        return await scrape(f"http://127.0.0.1:{self.metrics_port}/metrics")


GpuNodeFactory = Callable[..., Awaitable[GpuNode]]  # (model, count, system=None): system a whole server's layout


@pytest.fixture
async def gpu_node(
    cluster: DevCluster, kube: KubeClient, agent_rbac: None, unique: str, tmp_path: Path,
) -> AsyncIterator[GpuNodeFactory]:
    made: list[GpuNode] = []
    ca_pem = cluster_ca(cluster)

    async def create(model: str, count: int, system: str | None = None) -> GpuNode:
        name = f"t-{unique}-{len(made)}"
        await kube.create("/api/v1/nodes", fake_gpu_node(name, model, count, system=system))
        kubeconfig = await operator.agent_kubeconfig(kube, name, tmp_path, cluster.server, ca_pem)
        port = free_port()
        agent = operator.agent_component(name, kubeconfig, tmp_path / f"agent-{name}.log", port, short_dir())
        await agent.start()
        await agent.wait_healthy()
        node = GpuNode(name, agent, kubeconfig, port)
        made.append(node)
        return node

    yield create
    for node in made:
        await node.agent.stop()
        with contextlib.suppress(KubeError):
            await kube.delete(f"/api/v1/nodes/{node.name}")
