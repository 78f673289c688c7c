"""Fake GPU nodes with everything a real one runs: a pod runner (the kubelet's plugin manager and DRA
manager) and the gpuslice node agent, whose kubelet plugin registers with it and prepares the
claims the real scheduler allocated. On the session's control plane, next to its controller.

A node's agent runs the fake backend, or (``gpu_backend`` nvml) the NVML backend on gpuslice's mock
``libnvidia-ml.so.1`` (go-nvml's DGX mocks) under a fake driver root whose toolkit spec nvidia-ctk
wrote (``devcluster/mocknvml.py``). A test module that sets ``GPU_BACKENDS = ("fake", "nvml")`` runs
each of its tests on both."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest

from gpuslice.devcluster import binaries, mocknvml, operator
from gpuslice.devcluster.cluster import DevCluster
from gpuslice.devcluster.nodes import fake_gpu_node, node_layout, pod_runner_component
from gpuslice.devcluster.pki import CertificateAuthority
from gpuslice.kube.client import KubeClient, KubeError
from tests.cluster.gpu_nodes import cluster_ca
from tests.cluster.kubeutil import short_dir, wait_for
from tests.cluster.plugin.plugin_nodes import PluginNode, PluginNodeFactory, fake_gpus_mig_mode, without_fake_gpus


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    marker = metafunc.definition.get_closest_marker("gpu_backends")
    backends = marker.args if marker is not None else getattr(metafunc.module, "GPU_BACKENDS", None)
    if backends and "gpu_backend" in metafunc.fixturenames:
        metafunc.parametrize("gpu_backend", backends)


@pytest.fixture
def gpu_backend() -> str:
    """The backend of a test's nodes: fake, unless its module asks for more (GPU_BACKENDS)."""
    return "fake"


@pytest.fixture
async def plugin_node(
    cluster: DevCluster, kube: KubeClient, agent_rbac: None, unique: str, tmp_path: Path, gpu_backend: str,
) -> AsyncIterator[PluginNodeFactory]:
    made: list[PluginNode] = []
    found = await binaries.resolve(build_if_missing=False)
    assert found.pod_runner is not None, "the pod runner is built with the control plane (make kube-bin)"
    ca_pem = cluster_ca(cluster)
    ca = CertificateAuthority.load(cluster.state.pki)

    async def create(model: str, count: int, agent_args: Sequence[str] = (), backend: str | None = None) -> PluginNode:
        name = f"p-{unique}-{len(made)}"
        backend = backend or gpu_backend
        await kube.create("/api/v1/nodes", fake_gpu_node(name, model, count, backend))
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
        nvml, args = None, list(agent_args)
        if backend == "nvml":
            mig = fake_gpus_mig_mode(args)  # the fake backend's --fake-gpus MODEL:N:mig-on|off, as MIG mode at start
            args = without_fake_gpus(args)
            nvml = await asyncio.to_thread(mocknvml.prepare_node, root, name, model, count, mig)
        node = PluginNode(name, root, runner, args, tmp_path, nvml, model)
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
