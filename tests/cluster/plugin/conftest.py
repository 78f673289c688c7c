"""Fake GPU nodes with everything a real one runs: a pod runner (the kubelet's plugin manager and DRA
manager) and the gpuslice node agent, whose kubelet plugin registers with it and prepares the
claims the real scheduler allocated. On the session's control plane, next to its controller."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest

from gpuslice.devcluster import binaries, operator
from gpuslice.devcluster.cluster import DevCluster
from gpuslice.devcluster.nodes import fake_gpu_node, node_layout, pod_runner_component
from gpuslice.devcluster.pki import CertificateAuthority
from gpuslice.kube.client import KubeClient, KubeError
from tests.cluster.gpu_nodes import cluster_ca
from tests.cluster.kubeutil import short_dir, wait_for
from tests.cluster.plugin.plugin_nodes import PluginNode, PluginNodeFactory


@pytest.fixture
async def plugin_node(
    cluster: DevCluster, kube: KubeClient, agent_rbac: None, unique: str, tmp_path: Path,
) -> AsyncIterator[PluginNodeFactory]:
    made: list[PluginNode] = []
    found = await binaries.resolve(build_if_missing=False)
    assert found.pod_runner is not None, "the pod runner is built with the control plane (make kube-bin)"
    ca_pem = cluster_ca(cluster)
    ca = CertificateAuthority.load(cluster.state.pki)

    async def create(model: str, count: int, agent_args: Sequence[str] = ()) -> PluginNode:
        name = f"p-{unique}-{len(made)}"
        await kube.create("/api/v1/nodes", fake_gpu_node(name, model, count))
        root = short_dir()  # unix socket paths must stay under 108 bytes
        # Where `gpuslice dev-cluster exec-env` looks for what containers received.
        link = cluster.state.root / "nodes" / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(root)
        node_kubeconfig = node_layout(root, name, cluster.server, ca)
        assert found.pod_runner is not None
        runner = pod_runner_component(found.pod_runner, name, root, node_kubeconfig, tmp_path / f"runner-{name}.log",
                                      cluster.lease_exists(name))
        await operator.agent_kubeconfig(kube, name, tmp_path, cluster.server, ca_pem)  # agent-<name>.kubeconfig
        node = PluginNode(name, root, runner, list(agent_args), tmp_path)
        made.append(node)
        await runner.start()
        await runner.wait_healthy()
        await node.start_agent()
        await wait_for(node.registered, within=30, what=f"the agent on {name} to register with the pod runner")
        return node

    yield create
    for node in made:
        await node.agent.stop()
        node.kill_mps_daemons()  # they outlive an agent on purpose (its pods keep running)
        await node.runner.stop()
        with contextlib.suppress(KubeError):
            await kube.delete(f"/api/v1/nodes/{node.name}")
        with contextlib.suppress(OSError):
            (cluster.state.root / "nodes" / node.name).unlink()
